// Whole models (tparity model, docs/models.md): a checkpoint's export (scripts/export_model.py writes
// it with transformers itself) checked layer by layer and end to end.
//
// An export is a folder:
//   model.json + model.safetensors   what the model is and the end to end results: the token ids, the
//                                    float64 truth's hidden state entering each checked layer
//                                    (hidden.K) and transformers' own float32 chain (hidden_float32.K),
//                                    the final norm, the head, the logits, greedy generation
//   layer_NNN.json (+ .safetensors)  one fixture per layer (fixture format v2): the layer's weights, the
//                                    truth's input to it, every component in float64 and float32
// Each layer is checked three ways:
//   local   the layer on the truth's own input (check_fixture: hand core vs LibTorch vs transformers,
//           every component, the noise model's gates, the first diverging component)
//   chain   the hand core's own hidden states carried from layer to layer (float64 and float32) against
//           the truth's at the same depth: an error made at layer k shows in k's local check, one
//           inherited from below in the chain only; the float32 chain's error is judged against
//           transformers' own float32 chain's at the same depth by the component gates' rule
//           (2 x quantile(n_eff) x its rel_l2 + 4u, one sample)
//   end     the final norm and the head on the chain's last hidden state: logits' rel_l2, KL divergence,
//           top-1 agreement, expected flips; greedy generation token by token with the KV cache
// Layers are read one at a time and dropped (a model's weights are never all held at once), but for
// greedy generation, which needs every layer at each step.
#pragma once

#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tparity/compare/legs.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/fixture/safetensors.hpp"

namespace tparity {

inline constexpr const char* kModelFormat = "tparity.model";
inline constexpr int kModelVersion = 1;

struct ModelLayerEntry {
  int64_t index = 0;
  std::string fixture;  // its path (the export's folder joined with the plain file name model.json gives)
};

struct ModelExport {
  std::string dir, name, description, architecture, module, checkpoint;
  nlohmann::json reference;  // what produced it: torch, transformers, how the truth was made
  int64_t num_layers = 0, hidden = 0, vocab = 0, first = 0, last = 0;  // the slice [first, last)
  std::vector<ModelLayerEntry> layers;
  std::string final_norm = "none";  // "rms" | "gemma_rms" | "layer" | "none"
  double final_norm_eps = 0;
  std::optional<double> logit_softcap;
  int64_t generate_steps = 0, prompt_length = 0;
  std::vector<std::string> prompts;
  // The checkpoint's tensors that the model its config builds does not read (a config of fewer layers
  // than the weights, a pretraining head beside a base model): how many, and the first few names;
  // -1 when the exporter could not tell (a GGUF file).
  int64_t unused_count = -1;
  std::vector<std::string> unused_first;
  std::shared_ptr<const SafetensorsFile> tensors;  // model.safetensors
  bool has_head() const { return tensors->find("lm_head.weight") != nullptr; }
};

// Reads and validates an export's model.json and model.safetensors (every field, every tensor's
// shape against the model's sizes, the layer files named as plain names in the folder). InputError
// naming the file and the field.
ModelExport read_model_export(const std::string& dir);

// Statistics over the positions that hold a real token (attention_mask 1).
struct PositionStats {
  double mean = 0, p99 = 0, max = 0;
};

struct ModelLayerResult {
  int64_t index = 0;
  std::vector<CaseReport> local;   // check_fixture's reports on the truth's input
  bool local_pass = true;
  std::string local_divergence;    // the first component whose local error breaks its gate
  double decode64 = 0;             // a decoder: its KV-cache session's output against the truth's, float64
  double chain64 = 0, chain32 = 0;  // rel_l2 of the hand core's chain against the truth's, after this layer
  double ref32 = 0;                 // transformers' float32 chain against the truth's at the same depth
  double bound32 = 0;               // chain32's bound: 2 x quantile(n_eff, 1) x ref32 + 4u (compare/noise.hpp)
  double n_eff = 0;                 // the effective elements of transformers' own float32 error there
  bool chain_pass = true;
};

struct ModelFlip {
  int64_t batch = 0, position = 0;
  int64_t truth = 0, got = 0;  // the truth's argmax and the one that came
  double margin = 0;           // the truth's top-2 logit margin there
  double p_flip = 0;           // the probability that the reference's own float32 noise flips it
  bool explained = false;      // p_flip >= kFlipExplained
};

struct ModelLogitsResult {
  bool present = false;
  int64_t positions = 0;
  double rel64 = 0, rel32 = 0, ref32 = 0;  // rel_l2 against the truth: hand64, hand32, transformers' float32
  double bound32 = 0, n_eff = 0;            // rel32's bound, as a chain's
  bool has64 = true;                         // a float64 run was judged (not a float32 dump's)
  PositionStats kl32, kl_ref;              // KL(truth || hand32), KL(truth || transformers' float32), per position
  int64_t top1_32 = 0, top1_64 = 0, top1_ref = 0;  // positions whose argmax is the truth's
  double expected_flips = 0;                        // sum over positions of p_flip
  double min_margin = 0;
  std::vector<ModelFlip> flips32, flips64;  // hand positions whose argmax is not the truth's
  bool pass = true;
};

struct ModelGenerationResult {
  bool present = false;
  int64_t steps = 0, prompt_length = 0;
  std::vector<int64_t> truth, hand64, hand32, ref32;  // the generated tokens
  // The first step where each differs from the truth (-1 none), the truth's margin there and the
  // probability that the reference's own float32 noise flips it.
  int64_t first64 = -1, first32 = -1, first_ref = -1;
  double margin64 = 0, margin32 = 0, p_flip32 = 0, p_flip64 = 0;
  // The steps' logits against the truth's while the tokens agree (and at the first that differs):
  // hand64, hand32, transformers' float32 (teacher-forced on the truth's tokens).
  double logits64 = 0, logits32 = 0, logits_ref = 0, logits_bound = 0;
  bool pass = true;
};

struct ModelReport {
  std::string name, description;
  nlohmann::json config;
  ReferenceInfo reference;
  std::vector<ModelLayerResult> layers;
  // Where it breaks: the first layer whose local check fails (its component), else the first layer
  // whose chain breaks its bound with every local check passing (an error inherited and grown).
  int64_t first_layer = -1;
  std::string first_detail;
  ModelLogitsResult logits;
  ModelGenerationResult generation;
  std::vector<std::string> notes;
  std::string dump;  // judge_dump: the dump's file (the table's columns are its, not the hand core's)
  bool pass = true;
};

// The probability of a flip below which the reference's own float32 noise does not explain it.
inline constexpr double kFlipExplained = 1e-3;

struct ModelOptions {
  bool local = true;       // the layer checks on the truth's inputs (LibTorch too, when built with it)
  bool generate = true;    // greedy generation, when the export holds it
  Defect defect = Defect::None;  // planted in the hand core at layer defect_layer alone (tests, docs)
  int64_t defect_layer = -1;
  // A weight of one layer moved in the hand core's copy alone (tests, docs: the detection threshold):
  // Gaussian noise of relative size perturb_size (||dW|| / ||W||), deterministic.
  int64_t perturb_layer = -1;
  std::string perturb_weight;
  double perturb_size = 0;
  GatePolicy policy;
};

ModelReport check_model(const ModelExport& m, const ModelOptions& o);

// An engine's activations for the export's tokens (safetensors: "layers.N.<component>" with the
// components the layer fixtures name, "layers.N.output" the hidden state after layer N, "logits"),
// float32 or float64, judged against the truth: each layer's output against transformers' own
// float32 chain at that depth (as the hand core's chain), the first diverging layer named, its components and the
// logits measured. InputError naming the dump and the tensor for a name or shape it does not know.
ModelReport judge_dump(const ModelExport& m, const std::string& dump);

std::string render_model(const ModelReport& r, bool full);
nlohmann::json to_json(const ModelReport& r);

}  // namespace tparity
