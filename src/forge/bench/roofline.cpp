#include "forge/bench/roofline.h"

#include "forge/io/json_input.h"
#include "forge/telemetry/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "forge/bench/gemm.h"
#include "forge/bench/layer.h"
#include "forge/bench/memory.h"
#include "forge/core/error.h"

namespace forge::bench {

namespace {

double dtype_bytes(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "f64") return 8;
  if (dtype.rfind("fp8", 0) == 0) return 1;  // fp8, fp8-rowwise, fp8-blockwise
  return 4;  // f32, tf32
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

void set_device(Roofline& r, const nlohmann::json& doc) {
  if (r.device.empty()) {
    r.device = doc.value("device", "");
    r.device_name = doc.value("device_name", "");
  }
}

void add_ceiling(Roofline& r, const std::string& dtype, double tflops, const std::string& from) {
  for (RooflineCeiling& c : r.compute) {
    if (c.dtype != dtype) continue;
    if (tflops > c.tflops) c = RooflineCeiling{dtype, tflops, from};
    return;
  }
  r.compute.push_back(RooflineCeiling{dtype, tflops, from});
}

}  // namespace

double ridge_point(double peak_tflops, double bandwidth_gbs) {
  return bandwidth_gbs > 0 ? peak_tflops * 1e12 / (bandwidth_gbs * 1e9) : 0;
}

double attainable_tflops(double intensity, double peak_tflops, double bandwidth_gbs) {
  return std::min(peak_tflops, bandwidth_gbs * 1e9 * intensity / 1e12);
}

const RooflineCeiling* ceiling_for(const Roofline& r, const std::string& dtype) {
  for (const auto& c : r.compute)
    if (c.dtype == dtype) return &c;
  for (const auto& c : r.compute)
    if (c.dtype == "f32") return &c;
  return r.compute.empty() ? nullptr : &r.compute.front();
}

void add_to_roofline(Roofline& r, const nlohmann::json& doc) {
  const std::string what = doc.value("benchmark", "");
  if (what == "gemm") {
    set_device(r, doc);
    for (const auto& x : doc.at("results")) {
      RooflinePoint p;
      const std::string dt = x.at("dtype").get<std::string>();
      const double m = x.at("m").get<double>(), n = x.at("n").get<double>(), k = x.at("k").get<double>();
      p.name = "gemm " + dt + " " + (m == n && n == k ? fmt("%.0f", m) : fmt("%.0f", m) + "x" + fmt("%.0f", n) + "x" + fmt("%.0f", k));
      p.kind = "gemm";
      p.dtype = dt;
      p.flops = x.at("flops").get<double>();
      p.bytes = (m * k + k * n + m * n) * dtype_bytes(dt);
      p.ms = x.at("median_ms").get<double>();
      add_ceiling(r, dt, p.tflops(), p.name);
      r.points.push_back(p);
    }
  } else if (what == "memory") {
    set_device(r, doc);
    for (const auto& x : doc.at("results")) {
      const std::string k = x.at("kernel").get<std::string>();
      const int64_t n = x.at("elements").get<int64_t>();
      const double gbs = x.at("gbs").get<double>();
      if ((k == "copy" || k == "stream_copy") && gbs > r.bandwidth_gbs) {
        r.bandwidth_gbs = gbs;
        const std::string note = x.value("note", "");
        r.bandwidth_from = k + " " + element_count_str(n) + (note.empty() ? "" : " (" + note + ")");
      }
      if (x.at("flops").get<double>() <= 0) continue;
      RooflinePoint p;
      p.name = k + " " + element_count_str(n);
      p.kind = "memory";
      p.dtype = x.at("dtype").get<std::string>();
      p.flops = x.at("flops").get<double>();
      p.bytes = x.at("bytes").get<double>();
      p.ms = x.at("median_ms").get<double>();
      r.points.push_back(p);
    }
  } else if (what == "layer") {
    set_device(r, doc);
    const std::string dt = doc.at("config").at("dtype").get<std::string>();
    for (const auto& x : doc.at("parts")) {
      RooflinePoint p;
      p.name = "layer " + x.at("name").get<std::string>();
      p.kind = x.at("kind").get<std::string>();
      p.dtype = dt;
      p.flops = x.at("op_flops_fwd").get<double>() + x.at("op_flops_bwd").get<double>();
      p.bytes = x.at("bytes_fwd").get<double>() + x.at("bytes_bwd").get<double>();
      p.ms = x.at("total_ms").get<double>();
      if (p.flops > 0 && p.bytes > 0) r.points.push_back(p);
    }
  }
  std::sort(r.compute.begin(), r.compute.end(), [](const auto& a, const auto& b) { return a.tflops > b.tflops; });
}

Roofline roofline_from(const std::vector<nlohmann::json>& docs) {
  Roofline r;
  for (const auto& d : docs) add_to_roofline(r, d);
  return r;
}

Roofline run_roofline(const RooflineOptions& opt) {
  std::vector<nlohmann::json> docs;
  if (!opt.from.empty()) {
    for (const std::string& f : opt.from) {
      std::ifstream in(f);
      FORGE_CHECK(in.good(), "bench roofline: cannot read '", f, "'");
      std::stringstream text;
      text << in.rdbuf();
      const nlohmann::json j = io::parse_json(text.str(), "bench roofline: '" + f + "'");  // Note [untrusted JSON]
      FORGE_CHECK(j.is_object() && j.contains("benchmark"), "bench roofline: '", f,
                  "' is not the --json output of forge bench gemm, memory or layer");
      docs.push_back(j);
    }
    return roofline_from(docs);
  }
  const bool gpu = opt.device.is_cuda();
  GemmOptions g;
  g.device = opt.device;
  g.shapes = square_shapes(gpu ? std::vector<int64_t>{1024, 4096, 8192} : std::vector<int64_t>{256, 512});
  g.dtypes = gpu ? std::vector<std::string>{"bf16", "f32"} : std::vector<std::string>{"f32", "f64"};
  g.repeats = opt.repeats;
  g.warmup_runs = opt.warmup_runs;
  g.warmup_ms = opt.warmup_ms;
  docs.push_back(to_json(run_gemm(g)));
  MemoryOptions m;
  m.device = opt.device;
  m.sizes = gpu ? parse_element_list("1M,16M,256M") : parse_element_list("1M,4M");
  m.repeats = opt.repeats;
  m.warmup_runs = opt.warmup_runs;
  m.warmup_ms = opt.warmup_ms;
  m.host = false;
  m.peer = false;
  docs.push_back(to_json(run_memory(m)));
  LayerOptions l;
  l.device = opt.device;
  l.config = default_layer_config(opt.device);
  l.repeats = opt.repeats;
  l.warmup_runs = opt.warmup_runs;
  l.warmup_ms = opt.warmup_ms;
  docs.push_back(to_json(run_layer(l)));
  return roofline_from(docs);
}

nlohmann::json to_json(const Roofline& r) {
  nlohmann::json j;
  j["benchmark"] = "roofline";
  j["device"] = r.device;
  j["device_name"] = r.device_name;
  j["bandwidth_gbs"] = r.bandwidth_gbs;
  j["bandwidth_from"] = r.bandwidth_from;
  nlohmann::json ceilings = nlohmann::json::array();
  for (const auto& c : r.compute)
    ceilings.push_back({{"dtype", c.dtype},
                        {"tflops", c.tflops},
                        {"from", c.from},
                        {"ridge_flop_per_byte", ridge_point(c.tflops, r.bandwidth_gbs)}});
  j["compute_ceilings"] = ceilings;
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : r.points) {
    const RooflineCeiling* c = ceiling_for(r, p.dtype);
    const double roof = c != nullptr && r.bandwidth_gbs > 0 ? attainable_tflops(p.intensity(), c->tflops, r.bandwidth_gbs) : 0;
    points.push_back({{"name", p.name},
                      {"kind", p.kind},
                      {"dtype", p.dtype},
                      {"flops", p.flops},
                      {"bytes", p.bytes},
                      {"ms", p.ms},
                      {"flop_per_byte", p.intensity()},
                      {"tflops", p.tflops()},
                      {"gbs", p.gbs()},
                      {"roof_tflops", roof},
                      {"roof_pct", roof > 0 ? nlohmann::json(100 * p.tflops() / roof) : nlohmann::json(nullptr)},
                      {"bound", c != nullptr && p.intensity() < ridge_point(c->tflops, r.bandwidth_gbs) ? "memory" : "compute"}});
  }
  j["points"] = points;
  j["method"] = {{"bandwidth", "best copy GB/s measured (bytes read + written)"},
                 {"compute", "best TFLOP/s measured per GEMM dtype"},
                 {"ridge", "peak FLOP/s / bandwidth, FLOP/byte"},
                 {"layer_flops", "GEMMs and attention: model FLOPs; norms, activations, residuals: rough op counts"}};
  return j;
}

std::string roofline_svg(const Roofline& r) {
  constexpr double W = 960, H = 640, L = 90, R = 40, T = 50, B = 70;
  // The FLOP/s unit of the y labels: TFLOP/s when a roof reaches 1 TFLOP/s, else GFLOP/s.
  double top = 0;
  for (const auto& c : r.compute) top = std::max(top, c.tflops);
  for (const auto& p : r.points) top = std::max(top, p.tflops());
  const bool tera = top >= 1;
  const double unit = tera ? 1 : 1e3;  // label value = tflops * unit
  // Ranges (decades) covering the points, the ridges and the roofs.
  double xlo = 1e300, xhi = 0, ylo = 1e300, yhi = 0;
  for (const auto& p : r.points) {
    if (p.intensity() <= 0 || p.tflops() <= 0) continue;
    xlo = std::min(xlo, p.intensity());
    xhi = std::max(xhi, p.intensity());
    ylo = std::min(ylo, p.tflops());
    yhi = std::max(yhi, p.tflops());
  }
  for (const auto& c : r.compute) {
    yhi = std::max(yhi, c.tflops);
    ylo = std::min(ylo, c.tflops);
    const double rp = ridge_point(c.tflops, r.bandwidth_gbs);
    if (rp > 0) {
      xlo = std::min(xlo, rp);
      xhi = std::max(xhi, rp);
    }
  }
  if (xhi <= 0) {
    xlo = 0.1;
    xhi = 100;
  }
  if (yhi <= 0) {
    ylo = 1e-3;
    yhi = 1;
  }
  const double lx0 = std::floor(std::log10(xlo / 2)), lx1 = std::ceil(std::log10(xhi * 2));
  const double ly0 = std::floor(std::log10(ylo / 2)), ly1 = std::ceil(std::log10(yhi * 2));
  const auto X = [&](double v) { return L + (std::log10(v) - lx0) / (lx1 - lx0) * (W - L - R); };
  const auto Y = [&](double v) { return H - B - (std::log10(v) - ly0) / (ly1 - ly0) * (H - T - B); };
  const double xmin = std::pow(10.0, lx0), xmax = std::pow(10.0, lx1), ymin = std::pow(10.0, ly0);

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " "
    << H << "\" font-family=\"sans-serif\">\n<!-- forge bench roofline -->\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"" << W / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"17\">Roofline: "
    << telemetry::xml_escape(r.device_name.empty() ? r.device : r.device_name) << " (" << telemetry::xml_escape(r.device) << ")</text>\n";
  // Grid and decade labels.
  for (double e = lx0; e <= lx1 + 1e-9; e += 1) {
    const double x = X(std::pow(10.0, e));
    s << "<line x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << H - B << "\" stroke=\"#ddd\"/>\n";
    s << "<text x=\"" << x << "\" y=\"" << H - B + 18 << "\" text-anchor=\"middle\" font-size=\"12\">"
      << fmt("%g", std::pow(10.0, e)) << "</text>\n";
  }
  for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
    const double y = Y(std::pow(10.0, e));
    s << "<line x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << W - R << "\" y2=\"" << y << "\" stroke=\"#ddd\"/>\n";
    s << "<text x=\"" << L - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\" font-size=\"12\">"
      << fmt("%g", std::pow(10.0, e) * unit) << "</text>\n";
  }
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  s << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 25
    << "\" text-anchor=\"middle\" font-size=\"14\">arithmetic intensity (FLOP/byte)</text>\n";
  s << "<text transform=\"translate(22," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"14\">"
    << (tera ? "TFLOP/s" : "GFLOP/s") << "</text>\n";
  // Roofs: bandwidth x intensity up to each compute ceiling, then flat.
  const char* roof_colors[] = {"#c0392b", "#2c3e50", "#8e44ad", "#16a085", "#d35400"};
  for (size_t i = 0; i < r.compute.size(); ++i) {
    const RooflineCeiling& c = r.compute[i];
    const char* col = roof_colors[i % 5];
    const double rp = ridge_point(c.tflops, r.bandwidth_gbs);
    s << "<polyline fill=\"none\" stroke=\"" << col << "\" stroke-width=\"2\" points=\"";
    if (rp > 0) {
      const double x0 = std::max(xmin, ymin / (r.bandwidth_gbs * 1e9 / 1e12));  // where the slope enters
      s << X(x0) << "," << Y(attainable_tflops(x0, c.tflops, r.bandwidth_gbs)) << " " << X(rp) << "," << Y(c.tflops) << " ";
    } else {
      s << X(xmin) << "," << Y(c.tflops) << " ";
    }
    s << X(xmax) << "," << Y(c.tflops) << "\"/>\n";
    s << "<text x=\"" << X(xmax) - 6 << "\" y=\"" << Y(c.tflops) - 6 << "\" text-anchor=\"end\" font-size=\"12\" fill=\"" << col
      << "\">" << telemetry::xml_escape(c.dtype) << " peak " << fmt("%.4g", c.tflops * unit) << (tera ? " TFLOP/s" : " GFLOP/s")
      << " (measured)</text>\n";
    if (rp > 0) {
      s << "<circle cx=\"" << X(rp) << "\" cy=\"" << Y(c.tflops) << "\" r=\"3\" fill=\"" << col << "\"/>\n";
      s << "<text x=\"" << X(rp) + 4 << "\" y=\"" << Y(c.tflops) + 14 << "\" font-size=\"11\" fill=\"" << col
        << "\">ridge " << fmt("%.3g", rp) << " FLOP/B</text>\n";
    }
  }
  if (r.bandwidth_gbs > 0) {
    // Label the slope near its lower end.
    const double x0 = std::max(xmin, ymin / (r.bandwidth_gbs * 1e9 / 1e12)) * 1.5;
    const double y0 = r.bandwidth_gbs * 1e9 * x0 / 1e12;
    s << "<text x=\"" << X(x0) + 6 << "\" y=\"" << Y(y0) - 8 << "\" font-size=\"12\" fill=\"#c0392b\">"
      << fmt("%.0f", r.bandwidth_gbs) << " GB/s (best copy)</text>\n";
  }
  // Points.
  const auto color = [](const std::string& kind) {
    if (kind == "gemm") return "#2980b9";
    if (kind == "attention") return "#27ae60";
    if (kind == "memory") return "#e67e22";
    if (kind == "norm") return "#9b59b6";
    if (kind == "activation") return "#f1c40f";
    return "#7f8c8d";  // residual
  };
  for (const auto& p : r.points) {
    if (p.intensity() <= 0 || p.tflops() <= 0) continue;
    const double x = X(p.intensity()), y = Y(p.tflops());
    s << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"4.5\" fill=\"" << color(p.kind) << "\" stroke=\"black\" stroke-width=\"0.5\"><title>"
      << telemetry::xml_escape(p.name) << ": " << fmt("%.3g", p.intensity()) << " FLOP/B, " << fmt("%.4g", p.tflops() * unit)
      << (tera ? " TFLOP/s" : " GFLOP/s") << "</title></circle>\n";
    s << "<text x=\"" << x + 7 << "\" y=\"" << y + 4 << "\" font-size=\"10\">" << telemetry::xml_escape(p.name) << "</text>\n";
  }
  // Legend.
  double ly = T + 14;
  for (const char* k : {"gemm", "attention", "memory", "norm", "activation", "residual"}) {
    s << "<circle cx=\"" << L + 14 << "\" cy=\"" << ly - 4 << "\" r=\"4.5\" fill=\"" << color(k) << "\"/>";
    s << "<text x=\"" << L + 24 << "\" y=\"" << ly << "\" font-size=\"11\">" << k << "</text>\n";
    ly += 16;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace forge::bench
