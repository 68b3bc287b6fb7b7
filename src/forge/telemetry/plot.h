#pragma once
// `forge plot RUN... [--out curves.svg]`: a run's curves (or several runs', to compare) as one SVG,
// from their metrics.jsonl, with no Python.
//
// Panels, each against the optimizer step, one polyline per run in its own colour (a legend
// names the runs): training loss, validation loss (val_loss, at the evaluation steps), learning
// rate, throughput (the "<units>_per_s" of the progress records: tokens/s or images/s) and MFU.
// A panel that no run has data for is left out. Skipped steps and final records are not
// plotted. Axes are linear, from the data's range (loss and the rates from 0 when their minimum
// is within half the range of 0), with 5 labelled ticks each.
#include <filesystem>
#include <string>
#include <vector>

namespace forge::telemetry {

struct PlotSeries {
  std::string run;                                // the run's name (its directory's)
  std::vector<std::pair<double, double>> points;  // (step, value)
};

struct PlotPanel {
  std::string title;      // e.g. "training loss"
  std::string key;        // the metrics.jsonl key, e.g. "loss"
  std::vector<PlotSeries> series;
};

// The panels of `runs` (run directories, or their metrics.jsonl files). Throws forge::Error
// naming a run that has no metrics.jsonl, or whose file has no training record.
std::vector<PlotPanel> plot_panels(const std::vector<std::filesystem::path>& runs);

// One SVG document of the panels (escaped text, one <polyline> per series per panel).
std::string plot_svg(const std::vector<PlotPanel>& panels);

}  // namespace forge::telemetry
