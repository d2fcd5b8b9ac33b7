// The reference's book classes ("Build a Large Language Model (From Scratch)", ch03): each forward()
// composed from ATen ops line by line as the book writes it, by its state_dict names. There is no
// LibTorch module to verify them against; the fixtures exported from the Python classes do
// (tparity check, libtorch64_vs_torch64).
#include "tparity/harness/book.hpp"

#include <cmath>
#include <limits>

#include "internal.hpp"

namespace tparity::torch_ref {

namespace {

struct Heads {
  TT q, k, v;  // (B, H, T, D)
};

// One set of projections under `pre`: keys = x @ W_key (v1, W (d_in, d_out)) or self.W_key(x)
// (nn.Linear: at::linear, as Python's F.linear calls it).
Heads project(const BookConfig& c, const Params& ps, const std::string& pre, const TT& x) {
  auto one = [&](const char* n) {
    if (c.cls == BookClass::SelfAttentionV1) return at::matmul(x, param(ps, pre + n));
    return at::linear(x, param(ps, pre + n + ".weight"), param(ps, pre + n + ".bias"));
  };
  return {one("W_query"), one("W_key"), one("W_value")};
}

// attn_scores = queries @ keys^T; masked_fill_(mask.bool()[:T, :T], -inf); softmax(attn_scores /
// keys.shape[-1] ** 0.5, dim=-1); context = attn_weights @ values. On (..., T, D) tensors.
struct Attended {
  TT scores, weights, context;
};
Attended attend(const BookConfig& c, const Params& ps, const std::string& pre, const TT& q, const TT& k, const TT& v) {
  const int64_t Tn = q.size(-2);
  TT scores = at::matmul(q, k.transpose(-2, -1));
  if (c.masked()) {
    const TT mask = param(ps, pre + "mask").to(at::kBool).slice(0, 0, Tn).slice(1, 0, Tn);
    scores.masked_fill_(mask, -std::numeric_limits<double>::infinity());
  }
  scores = scores / std::pow(double(k.size(-1)), 0.5);
  const TT weights = at::softmax(scores, -1);
  return {scores, weights, at::matmul(weights, v)};
}

}  // namespace

TorchRun run_book(const Problem& p, DType dtype, bool collect) {
  TorchRun run;
  const BookConfig& c = p.book;
  const Params ps = state_params(p, dtype);
  const TT x = input(p, "x", dtype);
  const Sink sink{collect ? &run.result.components : nullptr, "", "", ""};
  // Components batched (B = 1 for v1 and v2) and per head: (B, H, T, D).
  auto batched = [&](const TT& t) { return c.batched() ? t : t.unsqueeze(0); };
  TT out;
  switch (c.cls) {
    case BookClass::SelfAttentionV1:
    case BookClass::SelfAttentionV2:
    case BookClass::CausalAttention: {
      const Heads h = project(c, ps, "", x);
      const Attended a = attend(c, ps, "", h.q, h.k, h.v);
      sink.put("q", batched(h.q).unsqueeze(1));
      sink.put("k", batched(h.k).unsqueeze(1));
      sink.put("v", batched(h.v).unsqueeze(1));
      sink.put("scores", batched(a.scores).unsqueeze(1));
      sink.put("attn_weights", batched(a.weights).unsqueeze(1));
      sink.put("output", batched(a.context));
      out = a.context;
      break;
    }
    case BookClass::MultiHeadAttentionWrapper: {
      // torch.cat([head(x) for head in self.heads], dim=-1), then out_proj
      std::vector<TT> qs, ks, vs, scores, weights, contexts;
      for (int64_t i = 0; i < c.num_heads; ++i) {
        const std::string pre = "heads." + std::to_string(i) + ".";
        const Heads h = project(c, ps, pre, x);
        const Attended a = attend(c, ps, pre, h.q, h.k, h.v);
        qs.push_back(h.q), ks.push_back(h.k), vs.push_back(h.v);
        scores.push_back(a.scores), weights.push_back(a.weights), contexts.push_back(a.context);
      }
      sink.put("q", at::stack(qs, 1));
      sink.put("k", at::stack(ks, 1));
      sink.put("v", at::stack(vs, 1));
      sink.put("scores", at::stack(scores, 1));
      sink.put("attn_weights", at::stack(weights, 1));
      const TT context = at::cat(contexts, -1);
      sink.put("context", context);
      out = at::linear(context, param(ps, "out_proj.weight"), param(ps, "out_proj.bias"));
      sink.put("output", out);
      break;
    }
    case BookClass::MultiHeadAttention: {
      // view(b, T, H, D).transpose(1, 2), attention per head, transpose(1, 2).contiguous().view(b, T,
      // d_out), out_proj
      const int64_t B = x.size(0), Tn = x.size(1), H = c.num_heads, D = c.d_out / H;
      Heads h = project(c, ps, "", x);
      auto split = [&](const TT& t) { return t.view({B, Tn, H, D}).transpose(1, 2); };
      h = {split(h.q), split(h.k), split(h.v)};
      const Attended a = attend(c, ps, "", h.q, h.k, h.v);
      sink.put("q", h.q);
      sink.put("k", h.k);
      sink.put("v", h.v);
      sink.put("scores", a.scores);
      sink.put("attn_weights", a.weights);
      const TT context = a.context.transpose(1, 2).contiguous().view({B, Tn, c.d_out});
      sink.put("context", context);
      out = at::linear(context, param(ps, "out_proj.weight"), param(ps, "out_proj.bias"));
      sink.put("output", out);
      break;
    }
  }
  run.notes.push_back("no LibTorch module run: " + module_name(p.module) +
                      " is the book's Python class (LLMs-from-scratch ch03); its forward() composed from ATen ops "
                      "line by line");
  run.result.outputs["output"] = to_dtensor(out, dtype);
  return run;
}

}  // namespace tparity::torch_ref
