#include "engine/csv_monitor.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/engine.h"

namespace zinf::engine {

CsvMonitor::CsvMonitor(const std::string& output_path, const std::string& job_name) {
  const std::filesystem::path base = output_path.empty() ? "." : output_path;
  folder_ = (base / job_name).string();
  std::error_code ec;
  std::filesystem::create_directories(folder_, ec);
  if (ec || !std::filesystem::is_directory(folder_)) {
    throw EngineError(fmt::format("csv_monitor: cannot create the folder {}: {}", folder_,
                                  ec ? ec.message() : "a file of that name is in the way"));
  }
}

std::string CsvMonitor::file_for(const std::string& event) const {
  std::string name = event;
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return (std::filesystem::path(folder_) / (name + ".csv")).string();
}

void CsvMonitor::write(const std::string& event, int64_t step, double value) {
  auto it = files_.find(event);
  if (it == files_.end()) {
    const std::string path = file_for(event);
    std::error_code ec;
    const bool fresh =
        !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
    auto file = std::make_unique<std::ofstream>(path, std::ios::app);
    if (!*file) {
      throw EngineError(
          fmt::format("csv_monitor: cannot open {} for appending: {}", path, std::strerror(errno)));
    }
    if (fresh) {
      const auto slash = event.rfind('/');
      *file << "step," << (slash == std::string::npos ? event : event.substr(slash + 1)) << "\n";
    }
    it = files_.emplace(event, std::move(file)).first;
  }
  *it->second << step << ',' << fmt::format("{}", value) << '\n';
  it->second->flush();
  if (!*it->second) throw EngineError(fmt::format("csv_monitor: cannot write {}", file_for(event)));
}

}  // namespace zinf::engine
