// tparity bench --model EXPORT: a whole model's check timed and its memory measured (docs/models.md,
// "Scale"): each layer's hand-core forward in float32 on one thread (the median of --reps calls on the
// truth's input) beside transformers' own float32 forward of that layer (the exporter's median of 3, on
// one thread too), the whole `tparity model` check once, and the process's resident memory: before
// (the libraries and the export's mapping), at its peak, against one layer's float32 weights.
#include <fmt/format.h>

#include <iostream>

#include "bench.hpp"
#include "tparity/core/parallel.hpp"
#include "tparity/eval/model.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli::bench {

namespace {

// The exporter's figure under `key` in model.json's reference block, in ms ("" when it holds none).
std::vector<double> reference_ms(const ModelExport& m, const std::string& key) {
  std::vector<double> out;
  if (!m.reference.contains(key) || !m.reference.at(key).is_string()) return out;
  std::string s = m.reference.at(key).get<std::string>();
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(' ', at);
    if (end == std::string::npos) end = s.size();
    try {
      out.push_back(std::stod(s.substr(at, end - at)));
    } catch (const std::exception&) {
      return {};
    }
    at = end + 1;
  }
  return out;
}

}  // namespace

int bench_model(const Options& o, const std::string& dir) {
  set_num_threads(1);
  set_torch_threads(1);
  const int64_t rss_start = status_bytes("VmRSS:");
  check_export_folder(dir, "option --model");
  const ModelExport m = read_model_export(dir);
  const std::vector<double> hf = reference_ms(m, "transformers_float32_layer_ms");
  struct Row {
    int64_t index;
    double read_ms, hand_ms, hf_ms;
  };
  std::vector<Row> rows;
  int64_t layer_bytes = 0;
  for (const ModelLayerEntry& e : m.layers) {
    Problem p;
    const double read_ms = time_ms([&] { p = read_fixture(e.fixture, false); });
    int64_t n = 0;
    for (const auto& [_, t] : p.state_dict) n += t.numel();
    layer_bytes = std::max(layer_bytes, 4 * n);
    const std::function<void()> hand = prepare_hand(p, DType::Float32, e.fixture);
    std::vector<double> v;
    for (int r = 0; r < o.reps; ++r) v.push_back(time_ms(hand));
    const size_t i = size_t(e.index - m.first);
    rows.push_back({e.index, read_ms, stats(v).median, i < hf.size() ? hf[i] : -1});
  }
  const int64_t rss_before = status_bytes("VmRSS:");
  ModelOptions mo;
  ModelReport report;
  const double check_ms = time_ms([&] { report = check_model(m, mo); });
  const int64_t peak = status_bytes("VmHWM:");
  double hand_sum = 0, hf_sum = 0, read_sum = 0;
  for (const Row& r : rows) hand_sum += r.hand_ms, hf_sum += r.hf_ms, read_sum += r.read_ms;
  const bool have_hf = !hf.empty() && hf.size() == rows.size();
  const double mb = 1024.0 * 1024.0;
  if (o.format == Format::Json) {
    nlohmann::json layers = nlohmann::json::array();
    for (const Row& r : rows)
      layers.push_back({{"index", r.index}, {"read_ms", r.read_ms}, {"hand_float32_ms", r.hand_ms},
                        {"transformers_float32_ms", have_hf ? nlohmann::json(r.hf_ms) : nlohmann::json()}});
    nlohmann::json j = {{"model", m.name}, {"layers", layers}, {"hand_float32_forward_ms", hand_sum},
                        {"transformers_float32_forward_ms", have_hf ? nlohmann::json(hf_sum) : nlohmann::json()},
                        {"check_ms", check_ms}, {"check_pass", report.pass},
                        {"rss_start_bytes", rss_start}, {"rss_before_check_bytes", rss_before},
                        {"peak_rss_bytes", peak}, {"layer_float32_weight_bytes", layer_bytes},
                        {"reps", o.reps}, {"threads", 1}};
    std::cout << j.dump(2, ' ', false, kBadUtf8Replaced) << "\n";
  } else {
    std::cout << fmt::format("bench model {}: {} layers, one thread each side, medians of {} calls\n", m.name,
                             rows.size(), o.reps);
    std::cout << fmt::format("  {:>5}  {:>9}  {:>12}  {:>16}  {:>6}\n", "layer", "read ms", "hand f32 ms",
                             "transformers ms", "ratio");
    for (const Row& r : rows)
      std::cout << fmt::format("  {:>5}  {:>9.1f}  {:>12.2f}  {:>16}  {:>6}\n", r.index, r.read_ms, r.hand_ms,
                               have_hf ? fmt::format("{:.2f}", r.hf_ms) : "-",
                               have_hf && r.hf_ms > 0 ? fmt::format("{:.2f}", r.hand_ms / r.hf_ms) : "-");
    std::cout << fmt::format("  forward, every layer: hand float32 {:.1f} ms, transformers' float32 {} (ratio {})\n",
                             hand_sum, have_hf ? fmt::format("{:.1f} ms", hf_sum) : "not recorded",
                             have_hf && hf_sum > 0 ? fmt::format("{:.2f}", hand_sum / hf_sum) : "-");
    std::cout << fmt::format("  the whole check (tparity model: local, decode, chain, head{}): {:.1f} s, {}\n",
                             m.generate_steps ? ", generation" : "", check_ms / 1e3, report.pass ? "PASS" : "FAIL");
    std::cout << fmt::format(
        "  resident memory: {:.0f} MB at the start (libraries), {:.0f} MB before the check, peak {:.0f} MB: {:.0f} MB "
        "above the start = {:.1f} layers' float32 weights ({:.1f} MB each)\n",
        double(rss_start) / mb, double(rss_before) / mb, double(peak) / mb, double(peak - rss_start) / mb,
        layer_bytes ? double(peak - rss_start) / double(layer_bytes) : 0.0, double(layer_bytes) / mb);
  }
  return kPass;
}

}  // namespace tparity::cli::bench
