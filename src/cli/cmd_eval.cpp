// tparity eval: one implementation on a fixture's weights and inputs; writes its outputs.
#include <cstdio>
#include <map>
#include <stdexcept>

#include "common.hpp"
#include "tparity/fixture/fixture.hpp"
#include "tparity/fixture/outputs.hpp"
#include "tparity/harness/hand.hpp"
#include "tparity/torch/reference.hpp"

namespace tparity::cli {

namespace {

struct EvalOptions {
  std::string fixture, impl = "hand", out, tensors;
  DType dtype = DType::Float32;
};

int eval(const EvalOptions& o) {
  check_output_path(o.out, "option --out");  // before the fixture is read: a bad folder fails at once
  // What the fixture stores as results plays no part here: not read.
  Problem p = read_fixture(o.fixture, false);
  const bool safetensors = o.tensors.empty() ? !p.tensor_file.empty() : o.tensors == "safetensors";
  // Now that the fixture and its tensor file are known: neither is written over.
  check_output_path(o.out, "option --out");
  if (safetensors) check_output_path(tensor_file_beside(o.out), "option --out (its tensor file beside it)");
  RunResult r;
  if (o.impl == "hand") {
    r = run_hand(std::move(p), o.dtype, o.fixture);  // its weights released as converted
  } else {
    check_inputs(p, o.fixture);  // so that a tensor at odds with the config is named, not LibTorch's matmul
    TorchRun t = run_torch(p, o.dtype, false, o.fixture);
    if (!t.failure.empty()) throw std::runtime_error(o.fixture + ": LibTorch reference: " + t.failure);
    if (!t.module_ran)  // say where the outputs come from
      for (const std::string& n : t.notes)
        std::fprintf(stderr, "tparity: note: %s; outputs from the functional decomposition\n", n.c_str());
    r = std::move(t.result);
  }
  OutputsFile f;
  f.dtype = dtype_name(o.dtype);
  f.outputs = std::move(r.outputs);
  write_outputs_file(o.out, f, safetensors);
  return kPass;
}

}  // namespace

void register_eval(CLI::App& app, Action& action) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd =
      app.add_subcommand("eval", "Run one implementation on a fixture's weights and inputs and write its outputs");
  cmd->add_option("--fixture", o->fixture, "Fixture file (format v1)")->required();
  cmd->add_option("--impl", o->impl, "hand (the handwritten core) or torch (LibTorch)")
      ->check(CLI::IsMember({"hand", "torch"}))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--dtype", [o](const std::string& d) { o->dtype = dtype_from_name(d); }, "float32 or float64")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->default_str("float32");
  cmd->add_option("--out", o->out,
                  "Where to write the outputs file: {\"format\": \"tparity.outputs\", \"version\": 1, \"dtype\", "
                  "\"outputs\": {\"output\": T, \"attn_weights\": T}}")
      ->required();
  cmd->add_option("--tensors", o->tensors,
                  "inline, or safetensors (a .safetensors file beside --out); default: as the fixture holds them")
      ->check(CLI::IsMember({"inline", "safetensors"}));
  add_max_elements_option(*cmd);
  cmd->callback([o, &action] { action = [o] { return eval(*o); }; });
}

}  // namespace tparity::cli
