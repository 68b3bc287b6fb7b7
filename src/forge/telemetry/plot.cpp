// forge plot (contracts in plot.h).
#include "forge/telemetry/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "forge/core/error.h"
#include "forge/telemetry/metrics.h"

namespace forge::telemetry {

namespace fs = std::filesystem;

namespace {

const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string tick_label(double v, const std::string& key) {
  char b[32];
  if (key == "lr") std::snprintf(b, sizeof(b), "%.1e", v);
  else if (key.ends_with("_per_s")) return format_count(v);
  else if (key == "mfu") std::snprintf(b, sizeof(b), "%.0f%%", 100 * v);
  else if (std::abs(v) >= 1000) std::snprintf(b, sizeof(b), "%.0f", v);
  else std::snprintf(b, sizeof(b), "%.3g", v);
  return b;
}

}  // namespace

std::vector<PlotPanel> plot_panels(const std::vector<fs::path>& runs) {
  FORGE_CHECK(!runs.empty(), "plot: give at least one run directory (or metrics.jsonl)");
  std::vector<PlotPanel> panels = {{"training loss", "loss", {}}, {"validation loss", "val_loss", {}},
                                   {"learning rate", "lr", {}},   {"throughput", "_per_s", {}},
                                   {"MFU", "mfu", {}}};
  std::string rate_key;
  for (const auto& r : runs) {
    const bool file = r.extension() == ".jsonl";
    const fs::path path = file ? r : r / "metrics.jsonl";
    std::error_code ec;
    FORGE_CHECK(fs::is_regular_file(path, ec), "plot: '", path.string(), "' does not exist; give a run directory "
                "(<run.dir>/<run.name>) or its metrics.jsonl");
    const std::string name = (file ? fs::absolute(r).parent_path() : fs::absolute(r).lexically_normal()).filename().string();
    std::vector<PlotSeries> s(panels.size(), PlotSeries{name.empty() ? r.string() : name, {}});
    int64_t training = 0;
    for (const auto& rec : read_jsonl(path)) {
      if (!rec.contains("step") || rec.value("skipped", false)) continue;
      const double step = rec["step"].get<double>();
      if (rec.contains("val_loss") && rec["val_loss"].is_number()) s[1].points.emplace_back(step, rec["val_loss"].get<double>());
      if (rec.value("final", false) || !rec.contains("lr")) continue;  // the progress records from here
      ++training;
      for (size_t p : {size_t{0}, size_t{2}, size_t{4}})
        if (rec.contains(panels[p].key) && rec[panels[p].key].is_number())
          s[p].points.emplace_back(step, rec[panels[p].key].get<double>());
      for (const auto& [k, v] : rec.items())
        if (k.ends_with("_per_s") && v.is_number()) {
          if (rate_key.empty()) rate_key = k;
          if (k == rate_key) s[3].points.emplace_back(step, v.get<double>());
        }
    }
    FORGE_CHECK(training > 0, "plot: '", path.string(), "' has no training record (a run that has not logged a step yet?)");
    for (size_t p = 0; p < panels.size(); ++p) panels[p].series.push_back(std::move(s[p]));
  }
  if (!rate_key.empty()) {
    panels[3].key = rate_key;
    panels[3].title = rate_key.substr(0, rate_key.size() - 6) + " per second";
  }
  std::erase_if(panels, [](const PlotPanel& p) {
    return std::all_of(p.series.begin(), p.series.end(), [](const PlotSeries& s) { return s.points.empty(); });
  });
  return panels;
}

std::string plot_svg(const std::vector<PlotPanel>& panels) {
  const int W = 900, PH = 250, L = 80, R = 190, T = 34, B = 40;
  const int H = static_cast<int>(panels.size()) * PH + 10;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " "
    << H << "\" font-family=\"sans-serif\">\n<!-- forge plot -->\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t p = 0; p < panels.size(); ++p) {
    const PlotPanel& panel = panels[p];
    const int y0 = static_cast<int>(p) * PH;
    double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
    for (const auto& se : panel.series)
      for (const auto& [x, y] : se.points)
        if (std::isfinite(y)) xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    if (!std::isfinite(xmin)) continue;
    const bool from_zero = panel.key != "lr" && ymin >= 0 && ymin < 0.5 * (ymax - ymin);
    if (from_zero) ymin = 0;
    if (xmax == xmin) xmax = xmin + 1;
    if (ymax == ymin) ymax = ymin + (ymin == 0 ? 1 : std::abs(ymin) * 0.1);
    const double pad = 0.04 * (ymax - ymin);
    if (!from_zero) ymin -= pad;
    ymax += pad;
    auto X = [&](double x) { return L + (W - L - R) * (x - xmin) / (xmax - xmin); };
    auto Y = [&](double y) { return y0 + T + (PH - T - B) * (1 - (y - ymin) / (ymax - ymin)); };
    s << "<g class=\"panel\" data-key=\"" << xml_escape(panel.key) << "\">\n";
    s << "<text x=\"" << L << "\" y=\"" << y0 + 22 << "\" font-size=\"15\" font-weight=\"bold\">" << xml_escape(panel.title)
      << "</text>\n";
    s << "<rect x=\"" << L << "\" y=\"" << y0 + T << "\" width=\"" << W - L - R << "\" height=\"" << PH - T - B
      << "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (int k = 0; k <= 4; ++k) {
      const double yv = ymin + (ymax - ymin) * k / 4, xv = xmin + (xmax - xmin) * k / 4;
      s << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << Y(yv) << "\" y2=\"" << Y(yv)
        << "\" stroke=\"#eee\"/>\n<text x=\"" << L - 6 << "\" y=\"" << Y(yv) + 4
        << "\" text-anchor=\"end\" font-size=\"11\">" << xml_escape(tick_label(yv, panel.key)) << "</text>\n";
      s << "<text x=\"" << X(xv) << "\" y=\"" << y0 + PH - B + 16 << "\" text-anchor=\"middle\" font-size=\"11\">"
        << static_cast<int64_t>(std::llround(xv)) << "</text>\n";
    }
    s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << y0 + PH - 6 << "\" text-anchor=\"middle\" font-size=\"12\">step</text>\n";
    for (size_t i = 0; i < panel.series.size(); ++i) {
      const auto& se = panel.series[i];
      const char* col = kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
      if (!se.points.empty()) {
        s << "<polyline class=\"series\" data-run=\"" << xml_escape(se.run) << "\" fill=\"none\" stroke=\"" << col
          << "\" stroke-width=\"1.6\" points=\"";
        for (const auto& [x, y] : se.points)
          if (std::isfinite(y)) s << X(x) << "," << Y(y) << " ";
        s << "\"/>\n";
      }
      s << "<rect x=\"" << W - R + 12 << "\" y=\"" << y0 + T + 6 + 18 * static_cast<int>(i) << "\" width=\"14\" height=\"4\" fill=\""
        << col << "\"/><text x=\"" << W - R + 32 << "\" y=\"" << y0 + T + 12 + 18 * static_cast<int>(i)
        << "\" font-size=\"12\">" << xml_escape(se.run) << "</text>\n";
    }
    s << "</g>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace forge::telemetry
