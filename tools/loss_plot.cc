#include "tools/loss_plot.h"

#include <fmt/format.h>
#include <gnuplot-iostream.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace zinf::tools {
namespace {

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";  // gnuplot's single-quote escape
    else
      out += c;
  }
  return out + "'";
}

}  // namespace

std::string plot_path_problem(const std::string& png_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path(png_path);
  if (fs::is_directory(path, ec)) return fmt::format("{} is a folder", png_path);
  const fs::path folder = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::exists(folder, ec)) return fmt::format("its folder {} does not exist", folder.string());
  if (!fs::is_directory(folder, ec)) {
    return fmt::format("{} is not a folder", folder.string());
  }
  if (access(folder.c_str(), W_OK) != 0) {
    return fmt::format("its folder {} is not writable: {}", folder.string(), std::strerror(errno));
  }
  return {};
}

std::string write_loss_png(const LossCurve& curve, const std::string& png_path) {
  if (curve.points.empty()) return "no loss values to plot";
  if (!on_path("gnuplot")) return "gnuplot is not installed (Debian package gnuplot-nox)";
  if (std::string why = plot_path_problem(png_path); !why.empty()) return why;
  std::error_code ec;
  std::filesystem::remove(png_path, ec);
  try {
    // Neither of gnuplot's streams reaches the run's output: its stdout is where it writes the
    // image when `set output` fails, and a complaint of its own would garble the lines.
    Gnuplot gp("gnuplot >/dev/null 2>&1");
    gp << "set terminal png size 960,540 font ',11'\n";
    gp << "set output " << quoted(png_path) << "\n";
    gp << "set title " << quoted(curve.title) << "\n";
    gp << "set xlabel 'step'\nset ylabel 'loss (nats/token)'\nset grid\n";
    gp << "set key top right\n";
    gp << "plot '-' with lines lw 2 lc rgb '#1f77b4' title 'train loss'";
    if (!curve.eval_points.empty()) {
      gp << ", '-' with linespoints lw 2 pt 7 ps 1.2 lc rgb '#2ca02c' title 'held-out loss'";
    }
    if (curve.baseline) {
      gp << ", " << fmt::format("{:.6f}", *curve.baseline)
         << " with lines dt 2 lw 2 lc rgb '#d62728' title "
         << quoted(fmt::format("{} {:.3f}", curve.baseline_label, *curve.baseline));
    }
    gp << "\n";
    gp.send1d(curve.points);
    if (!curve.eval_points.empty()) gp.send1d(curve.eval_points);
    gp << "unset output\n";
  } catch (const std::exception& e) {
    return fmt::format("gnuplot failed: {}", e.what());
  }
  // Gnuplot's destructor closed the pipe and waited for gnuplot to exit.
  struct stat st {};
  if (stat(png_path.c_str(), &st) != 0 || st.st_size == 0) {
    return fmt::format("gnuplot did not write {}", png_path);
  }
  return {};
}

std::string sparkline(const std::vector<double>& values, size_t width) {
  static const char* const kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty() || width == 0) return {};
  const size_t n = std::min(width, values.size());
  std::vector<double> bins(n, 0.0);
  std::vector<size_t> counts(n, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t b = i * n / values.size();
    if (std::isfinite(values[i])) {
      bins[b] += values[i];
      ++counts[b];
    }
  }
  double lo = INFINITY, hi = -INFINITY;
  for (size_t b = 0; b < n; ++b) {
    if (counts[b] == 0) continue;
    bins[b] /= static_cast<double>(counts[b]);
    lo = std::min(lo, bins[b]);
    hi = std::max(hi, bins[b]);
  }
  std::string out;
  for (size_t b = 0; b < n; ++b) {
    if (counts[b] == 0) {
      out += ' ';
      continue;
    }
    const double t = hi > lo ? (bins[b] - lo) / (hi - lo) : 0.0;
    out += kBars[std::clamp(static_cast<int>(t * 7.0 + 0.5), 0, 7)];
  }
  return out;
}

}  // namespace zinf::tools
