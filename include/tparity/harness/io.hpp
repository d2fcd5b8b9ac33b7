// Files from strangers: every file tparity reads (a fixture, a problem, an outputs file, a baseline,
// a tensor file, a census shard) and every file it writes goes through here.
//
// Reading: a file is opened without following a symbolic link and without blocking (a FIFO never
// hangs the reader), and read only when it is a regular file of a sane size. JSON is parsed strictly:
// nesting is bounded (so that nothing recurses without limit on it later), a key repeated in an
// object is refused (JSON readers disagree on which one counts), and messages show values cut short.
//
// Writing: an output path is checked before any work (its folder exists and is writable; the path is
// no link, no directory, no device and no file this run reads), and a set of files (a JSON and the
// safetensors file it refers to, a report and a baseline) is written whole or not at all: each into
// a temporary file beside its place, then all renamed into place under a lock on their folders, so
// two runs writing the same files leave one run's set, never a mix.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tparity {

// JSON text larger than this is refused before it is read (a 197 MB problem file is a BERT-base layer).
inline constexpr uint64_t kMaxJsonBytes = uint64_t(4) << 30;
// Objects and arrays nested deeper than this are refused while parsing (the formats nest 5 levels).
inline constexpr int kMaxJsonDepth = 64;

// A read-only descriptor on the regular file `path`. InputError "<path>: cannot read <what>: ..."
// when it is a symbolic link, a directory, a FIFO, a device or a socket, or cannot be opened. The
// caller closes it. Remembered as an input of the run (is_input_file) unless `input` is false: a file
// tparity itself keeps and rewrites (tparity model's stamp beside an export).
int open_input_file(const std::string& path, const std::string& what, bool input = true);
// The whole of the regular file `path` (as open_input_file), refused above `max_bytes`.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes = kMaxJsonBytes,
                            bool input = true);
// Whether `path` is one of the files this process has read through open_input_file (the same file,
// by device and inode): outputs never replace an input.
bool is_input_file(const std::string& path);

// JSON text parsed strictly (above): InputError "<where>: malformed JSON: ..." otherwise.
nlohmann::json parse_json(const std::string& text, const std::string& where);
// A JSON value for a message: at most 40 characters, however long or deeply nested.
std::string show_json(const nlohmann::json& j);
// Text for a message: control characters escaped, cut to `max` characters with "...".
std::string show_text(const std::string& s, size_t max = 80);
// For nlohmann::json::dump's error handler: a string that is not UTF-8 (an environment variable's
// value, a name cut inside a character) written with U+FFFD in place of its bad bytes, where the
// default throws after the work is done. dump(indent, ' ', false, kBadUtf8Replaced).
inline constexpr nlohmann::json::error_handler_t kBadUtf8Replaced = nlohmann::json::error_handler_t::replace;

// A plain file name made from a name a file gave (a fixture's "name"): InputError naming `field`
// unless it is 1 to 128 bytes, has no '/', '\\' or control character, and does not start with '.'.
void check_file_name(const std::string& name, const std::string& where, const std::string& field);

// Checks, before any work, that `path` can be written as an output: its folder exists and is
// writable, and `path` is not a symbolic link, a directory, a FIFO, a device or an input of this run.
// `what` names it in the message ("option --junit").
void check_output_path(const std::string& path, const std::string& what);
// The same for an output folder (--out, --keep): created when missing (with its parents); refused
// when it is a symbolic link or not a directory.
void make_output_folder(const std::string& path, const std::string& what);

// Files written whole or not at all (above). add() stages nothing on disk; commit() writes every file
// to a temporary beside its place, then renames them in the order added (the tensor file before the
// JSON that refers to it). InputError naming the path when any cannot be written; then none is.
class OutputFiles {
 public:
  void add(std::string path, std::string bytes);
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> files_;
};

// One file, written whole (OutputFiles of one).
void write_output_file(const std::string& path, std::string bytes);

}  // namespace tparity
