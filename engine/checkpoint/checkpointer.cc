// Checkpointer (checkpointer.h): what it holds, and its log. save, prepare and load are in
// save.cc, prepared_save.cc and load.cc.

#include "engine/checkpoint/checkpointer.h"

#include <utility>

#include "engine/checkpoint/prepared_save.h"

namespace zinf::engine::checkpoint {

Checkpointer::Checkpointer(EngineParts parts) : e_(std::move(parts)) {}

Checkpointer::~Checkpointer() = default;

Checkpointer::Run::Run(const EngineParts& e)
    : rank(e.comm.rank()),
      world(e.comm.world_size()),
      stage(e.model.stage()),
      bf16(e.options.zero.precision == zero::Precision::kBFloat16),
      view(e.model, e.optimizer.state_arrays()) {}

void Checkpointer::log(const std::string& line) const {
  if (e_.comm.rank() == 0 && e_.options.log) {
    e_.options.log(line);
  }
}

}  // namespace zinf::engine::checkpoint
