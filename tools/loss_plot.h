// The loss curve of a run: a PNG drawn by gnuplot (Debian's gnuplot-nox, driven through
// gnuplot-iostream), with the corpus's unigram entropy as a dashed line to beat, and a
// one-line text sparkline for the terminal summary.
//
// Thread safety: free functions; write_loss_png starts a gnuplot process per call.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zinf::tools {

struct LossCurve {
  std::vector<std::pair<double, double>> points;       // (step, loss)
  std::vector<std::pair<double, double>> eval_points;  // (step, held-out loss), may be empty
  std::optional<double> baseline;                      // drawn as a horizontal line
  std::string baseline_label = "unigram entropy";
  std::string title;
};

// Writes `png_path`. Returns an empty string on success, else why not (gnuplot missing,
// gnuplot failed, the file not written) — a plot is never worth failing a run for.
[[nodiscard]] std::string write_loss_png(const LossCurve& curve, const std::string& png_path);

// Why `png_path` cannot be written, checked at start-up so a run does not learn it at the
// end: its folder is missing or not writable, or the path is a folder. Empty when it can be.
// Creates nothing.
[[nodiscard]] std::string plot_path_problem(const std::string& png_path);

// `width` characters of ▁▂▃▄▅▆▇█ over the values (resampled by averaging), lowest at ▁.
[[nodiscard]] std::string sparkline(const std::vector<double>& values, size_t width = 40);

}  // namespace zinf::tools
