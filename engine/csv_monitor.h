// DeepSpeed's `csv_monitor`: rank 0 appends each event the engine emits to
// `<output_path>/<job_name>/<event>.csv`, the file name being the event name with '/' and ' '
// replaced by '_' ("Train/Samples/train_loss" -> Train_Samples_train_loss.csv); the first
// row is `step,<last part of the event name>`, then one `step,value` row per event, step
// being the global sample count. Rows are flushed as written, so a killed run keeps its
// curve. A file that already exists is appended to (a resumed run continues its curve), its
// header not repeated.
//
// Thread safety: one thread (the engine's monitor callback).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>

namespace zinf::engine {

class CsvMonitor {
 public:
  // Creates `<output_path>/<job_name>/` (an empty output_path is the current folder). Throws
  // EngineError naming the folder when it cannot be created.
  CsvMonitor(const std::string& output_path, const std::string& job_name);

  // Appends one row; throws EngineError naming the file when it cannot be written.
  void write(const std::string& event, int64_t step, double value);

  [[nodiscard]] const std::string& folder() const noexcept { return folder_; }
  // The file an event goes to.
  [[nodiscard]] std::string file_for(const std::string& event) const;

 private:
  std::string folder_;
  std::map<std::string, std::unique_ptr<std::ofstream>> files_;
};

}  // namespace zinf::engine
