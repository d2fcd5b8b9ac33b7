// The book's attention classes as problems (core/book.hpp): what problem.cpp, the fixture reader
// and cases.cpp ask of these module kinds lives here, so that those files only dispatch.
//
// Module (the fixture's "module", the book's class names): SelfAttention_v1, SelfAttention_v2,
//   CausalAttention, MultiHeadAttentionWrapper, MultiHeadAttention (the book's; torch's is
//   MultiheadAttention, lower-case h).
// Config (the constructors' argument names): d_in, d_out; qkv_bias (all but v1); context_length
//   (CausalAttention and after; the book's block_size in its bonus code); num_heads (the wrapper and
//   MultiHeadAttention); dropout (0 if present).
// State dict (module.state_dict()'s names): W_query, W_key, W_value (v1, (d_in, d_out));
//   W_query.weight, W_query.bias, ... (nn.Linear, (d_out, d_in)); mask (the causal buffer,
//   (context_length, context_length)); heads.N.* for the wrapper's heads; out_proj.weight,
//   out_proj.bias.
// Inputs: x, (T, d_in) for v1 and v2, (B, T, d_in) for the others. Outputs: output.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tparity/harness/problem.hpp"

namespace tparity {

bool book_module(ModuleKind m);
BookClass book_class(ModuleKind m);

// problem.cpp's questions, for the book's kinds.
void book_state_dict(const Problem& p, std::vector<std::pair<std::string, Shape>>& out);
std::vector<InputSpec> book_inputs();
void validate_book(const Problem& p, const std::function<void(const std::string&)>& fail);
nlohmann::json book_config_json(const Problem& p);
std::string book_summary(const Problem& p);
std::vector<std::string> book_component_names(const Problem& p);

// Reads the fixture's config object into p.book; `fail(field, what)` throws. Every key must be one
// of the class's constructor arguments.
void read_book_config(const nlohmann::json& j, Problem& p,
                      const std::function<void(const std::string& field, const std::string& what)>& fail);

// The causal buffer the classes register: triu(ones(n, n), diagonal=1), as float values.
DTensor book_causal_buffer(int64_t context_length);

}  // namespace tparity
