// Files from strangers (harness/io.hpp).
#include "tparity/harness/io.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "tparity/harness/dtensor.hpp"

namespace tparity {

namespace {

namespace fs = std::filesystem;

// The files this process has read, by device and inode.
std::mutex g_inputs_mutex;
std::set<std::pair<dev_t, ino_t>> g_inputs;

// What a file of mode `m` is, for "it is a FIFO, not a regular file".
std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

// `path` without trailing slashes: lstat("link/") follows the link, lstat("link") does not.
std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The folder a file path lies in ("." for a bare name, "/" for a file at the root).
std::string folder_of(const std::string& path) {
  const std::string f = fs::path(without_trailing_slashes(path)).parent_path().string();
  return f.empty() ? (!path.empty() && path[0] == '/' ? "/" : ".") : f;
}

// Appends j as dump() writes it until `out` passes 40 characters; below `depth` levels an array or
// object is written "[...]" or "{...}" (dump() recurses once per level), a string cut before dump().
void show_into(const nlohmann::json& j, std::string& out, int depth) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    out += nlohmann::json(s.size() > 40 ? s.substr(0, 40) : s).dump(-1, ' ', false, kBadUtf8Replaced);
    return;
  }
  if (!j.is_structured()) {
    out += j.dump();
    return;
  }
  const bool array = j.is_array();
  if (depth == 0) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  for (auto it = j.begin(); it != j.end() && out.size() <= 40; ++it) {
    if (it != j.begin()) out += ',';
    if (!array)
      out += nlohmann::json(it.key().size() > 40 ? it.key().substr(0, 40) : it.key())
                 .dump(-1, ' ', false, kBadUtf8Replaced) +
             ':';
    show_into(it.value(), out, depth - 1);
  }
  out += array ? ']' : '}';
}

// The length of the well-formed UTF-8 sequence at s[i] (1 for ASCII), or 0 where the bytes are no such
// sequence: a stray continuation byte, a lead byte short of its continuations (the string's end
// included), an overlong form, a surrogate, past U+10FFFF.
int utf8_length(const std::string& s, size_t i) {
  auto at = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  auto cont = [&](size_t k, unsigned lo, unsigned hi) { return at(k) >= lo && at(k) <= hi; };
  const unsigned c = at(i);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1, 0x80, 0xBF) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF)
    return cont(i + 1, c == 0xE0 ? 0xA0 : 0x80, c == 0xED ? 0x9F : 0xBF) && cont(i + 2, 0x80, 0xBF) ? 3 : 0;
  if (c >= 0xF0 && c <= 0xF4)
    return cont(i + 1, c == 0xF0 ? 0x90 : 0x80, c == 0xF4 ? 0x8F : 0xBF) && cont(i + 2, 0x80, 0xBF) &&
                   cont(i + 3, 0x80, 0xBF)
               ? 4
               : 0;
  return 0;
}

// The code point of the n-byte well-formed UTF-8 sequence at s[i].
unsigned decode(const std::string& s, size_t i, int n) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]) & 0x3Fu; };
  unsigned code = static_cast<unsigned char>(s[i]) & (n == 1 ? 0x7Fu : n == 2 ? 0x1Fu : n == 3 ? 0x0Fu : 0x07u);
  for (int k = 1; k < n; ++k) code = code << 6 | at(i + size_t(k));
  return code;
}

// The characters past ASCII that a terminal or a reader splitting lines takes for more than text: the C1
// controls (U+0085, a line break to Python's splitlines; U+009B, a terminal's CSI), the line and paragraph
// separators U+2028 and U+2029, and the bidirectional embeddings, overrides and isolates (U+202A-U+202E,
// U+2066-U+2069), which reorder what a terminal shows.
bool unsafe_character(unsigned code) {
  return (code >= 0x80 && code <= 0x9F) || (code >= 0x2028 && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069);
}

}  // namespace

std::string show_text(const std::string& s, size_t max) {
  // Character by character: control characters (and the unsafe ones past ASCII) escaped, a byte that is
  // no UTF-8 text as \xNN (a terminal taking 8-bit controls reads a lone 0x9B as CSI, a Latin-1 reader a
  // lone 0x85 as a line break); cut before the first character, escape or not, that would pass `max`.
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = utf8_length(s, i);
    std::string piece;
    if (c == '\n')
      piece = "\\n";
    else if (c == '\t')
      piece = "\\t";
    else if (n == 0 || c < 0x20 || c == 0x7f)
      piece = fmt::format("\\x{:02x}", c);
    else if (const unsigned code = n > 1 ? decode(s, i, n) : c; unsafe_character(code))
      piece = fmt::format("\\u{:04x}", code);
    else
      piece = s.substr(i, size_t(n));
    if (out.size() + piece.size() > max) return out + "...";
    out += piece;
    i += n == 0 ? 1 : size_t(n);
  }
  return out;
}

std::string show_json(const nlohmann::json& j) {
  std::string s;
  show_into(j, s, 4);
  return s.size() > 40 ? show_text(s, 37) : show_text(s, 40);
}

int open_input_file(const std::string& path, const std::string& what, bool input) {
  const std::string where = show_text(path, 300);
  if (path.empty()) throw InputError("cannot read " + what + ": expected a file path, got \"\"");
  // O_NOFOLLOW: a link is refused, not read through; O_NONBLOCK: a FIFO opens at once (to be refused)
  // instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    struct stat st {};
    if (e == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      throw InputError(where + ": cannot read " + what +
                       ": it is a symbolic link (tparity reads no file through a link: name the file itself)");
    if (e == ENXIO) throw InputError(where + ": cannot read " + what + ": it is a socket, not a regular file");
    throw InputError(where + ": cannot open " + what + ": " + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw InputError(where + ": cannot read " + what + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(where + ": cannot read " + what + ": it is " + kind_of(st.st_mode) + ", not a regular file");
  }
  if (input) {
    const std::lock_guard<std::mutex> lock(g_inputs_mutex);
    g_inputs.insert({st.st_dev, st.st_ino});
  }
  return fd;
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes, bool input) {
  const int fd = open_input_file(path, what, input);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_fd{fd};
  const std::string where = show_text(path, 300);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(where + ": cannot read " + what + ": " + std::strerror(errno));
  if (uint64_t(st.st_size) > max_bytes)
    throw InputError(fmt::format("{}: cannot read {}: expected at most {} bytes, got {}", where, what, max_bytes,
                                 uint64_t(st.st_size)));
  std::string text;
  text.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError(where + ": cannot read " + what + ": " + std::strerror(errno));
    }
    text.append(buf, size_t(n));
    if (text.size() > max_bytes)  // it grew while read
      throw InputError(fmt::format("{}: cannot read {}: expected at most {} bytes, got more", where, what, max_bytes));
  }
  return text;
}

bool is_input_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const std::lock_guard<std::mutex> lock(g_inputs_mutex);
  return g_inputs.count({st.st_dev, st.st_ino}) > 0;
}

namespace {

// nlohmann::json's own DOM builder, fed by its SAX parser, with tparity's checks on the way in: the
// depth of nesting, and each key once per object. (A SAX handler, not the callback parser: that one
// calls a std::function for every number, 25 million of them in a BERT-base problem file.)
class StrictSax {
 public:
  using json = nlohmann::json;
  StrictSax(json& result, const std::string& where) : dom_(result, true), where_(where) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    enter(true);
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    Frame& f = frames_.back();
    f.key = k;
    if (!f.keys.insert(k).second)
      throw InputError(where_ + ": " + field() +
                       ": expected each key once in an object, got it twice (JSON readers disagree on which one "
                       "counts)");
    return dom_.key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    enter(false);
    return dom_.start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);  // throws e
  }

 private:
  // An open object (its keys so far, the current one) or array.
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;
  };

  void enter(bool object) {
    if (frames_.size() >= size_t(kMaxJsonDepth))
      throw InputError(fmt::format("{}: {}: expected at most {} levels of nested arrays and objects, got more", where_,
                                   field(), kMaxJsonDepth));
    frames_.push_back({object, {}, {}});
  }

  // "config.rope_theta[][]": where the parser is, for a message.
  std::string field() const {
    std::string f;
    for (const Frame& g : frames_) f += g.object ? (f.empty() ? "" : ".") + show_text(g.key, 40) : "[]";
    return f.empty() ? std::string("(top level)") : f;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const std::string& where_;
  std::vector<Frame> frames_;
};

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  // RFC 8259 (8.1): a JSON text carries no byte order mark; nlohmann::json would skip one, Python's
  // reader refuses it. Both readers of tparity's files refuse it, so that they read the same files.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0)
    throw InputError(where +
                     ": malformed JSON: it starts with a UTF-8 byte order mark (JSON texts carry none: "
                     "save it without)");
  nlohmann::json result;
  StrictSax sax(result, where);
  try {
    nlohmann::json::sax_parse(text, &sax);
  } catch (const nlohmann::json::exception& e) {
    // parse_error for the syntax (invalid UTF-8 included), out_of_range 406 for a number beyond
    // double's range (1e999: nlohmann::json refuses it rather than read it as inf).
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    what = show_text(what, 200);
    if (e.id == 406) what += " (expected a finite number; infinities are written \"inf\" and \"-inf\")";
    throw InputError(where + ": malformed JSON: " + what);
  }
  return result;
}

void check_file_name(const std::string& name, const std::string& where, const std::string& field) {
  auto fail = [&](const std::string& why) {
    throw InputError(where + ": " + field +
                     ": expected a plain name (1 to 128 bytes, no '/', '\\' or control "
                     "character, not starting with '.'; it names files), got \"" +
                     show_text(name, 60) + "\"" + why);
  };
  if (name.empty()) fail("");
  if (name.size() > 128) fail(fmt::format(" ({} bytes)", name.size()));
  if (name[0] == '.') fail("");
  for (unsigned char c : name)
    if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) fail("");
}

namespace {

// Why `path` cannot be written as an output ("" when it can): see check_output_path.
std::string output_problem(const std::string& given) {
  if (given.empty()) return "expected a file path, got \"\"";
  if (given.back() == '/') return "expected a file path, got a folder's (it ends in '/')";
  const std::string& path = given;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return "it is a symbolic link (tparity writes through no link and replaces none)";
    if (!S_ISREG(st.st_mode)) return "it is " + kind_of(st.st_mode) + ", not a file to write";
    if (is_input_file(path)) return "it is a file this run reads (an output never replaces an input)";
  } else if (errno != ENOENT) {
    return std::strerror(errno);
  }
  const std::string folder = folder_of(path);
  if (::stat(folder.c_str(), &st) != 0) return "its folder " + show_text(folder, 300) + " does not exist";
  if (!S_ISDIR(st.st_mode)) return show_text(folder, 300) + " is not a folder";
  if (::access(folder.c_str(), W_OK | X_OK) != 0) return "its folder " + show_text(folder, 300) + " is not writable";
  return "";
}

}  // namespace

void check_output_path(const std::string& path, const std::string& what) {
  if (const std::string why = output_problem(path); !why.empty())
    throw InputError(what + ": " + show_text(path, 300) + ": cannot write output: " + why);
}

void make_output_folder(const std::string& given, const std::string& what) {
  const std::string where = what + ": " + show_text(given, 300);
  if (given.empty()) throw InputError(what + ": expected a folder, got \"\"");
  const std::string path = without_trailing_slashes(given);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      throw InputError(where + ": it is a symbolic link (tparity writes through no link: name the folder itself)");
    if (!S_ISDIR(st.st_mode)) throw InputError(where + ": it is " + kind_of(st.st_mode) + ", not a folder");
  } else {
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) throw InputError(where + ": cannot create the folder: " + ec.message());
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) throw InputError(where + ": the folder is not writable");
}

void OutputFiles::add(std::string path, std::string bytes) { files_.emplace_back(std::move(path), std::move(bytes)); }

namespace {

// What a commit leaves on disk until it is done: its temporaries and the hard links that keep the
// files it replaces, both removed whatever happens (an exception, bad_alloc included).
struct Scratch {
  std::vector<std::string> paths;
  ~Scratch() {
    for (const std::string& p : paths) ::unlink(p.c_str());
  }
};

// A new name beside `target`, short whatever the target's (.tparity-<pid>-<n>.tmp; NAME_MAX holds it).
std::string beside(const std::string& target, const char* suffix) {
  static std::atomic<unsigned> counter{0};
  return (fs::path(folder_of(target)) / fmt::format(".tparity-{}-{}.{}", ::getpid(), counter++, suffix)).string();
}

// The folder of `path` by device and inode, and its name there: two spellings of one file ("./x" and
// "$PWD/x") are one key.
struct Place {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;
  bool operator<(const Place& o) const { return std::tie(dev, ino, name) < std::tie(o.dev, o.ino, o.name); }
};
Place place_of(const std::string& path) {
  struct stat st {};
  if (::stat(folder_of(path).c_str(), &st) != 0)
    throw InputError(show_text(path, 300) + ": cannot write output: " + std::strerror(errno));
  return {st.st_dev, st.st_ino, fs::path(path).filename().string()};
}

void write_all(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw InputError(show_text(path, 300) + ": cannot write output: " + std::strerror(n < 0 ? errno : EIO));
    done += size_t(n);
  }
}

// SIGINT, SIGTERM and SIGHUP held while a commit runs, delivered after it: a set is never left half
// in place, nor its temporaries behind, by a signal.
struct HoldSignals {
  sigset_t saved;
  HoldSignals() {
    sigset_t hold;
    sigemptyset(&hold);
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&hold, s);
    pthread_sigmask(SIG_BLOCK, &hold, &saved);
  }
  ~HoldSignals() { pthread_sigmask(SIG_SETMASK, &saved, nullptr); }
};

}  // namespace

void OutputFiles::commit() {
  const HoldSignals hold;
  Scratch scratch;
  // 0. Each target once, and writable (checked again: a path may have changed since the verb began).
  std::map<Place, std::string> places;
  for (const auto& [path, bytes] : files_) {
    if (const std::string why = output_problem(path); !why.empty())
      throw InputError(show_text(path, 300) + ": cannot write output: " + why);
    if (auto [it, fresh] = places.emplace(place_of(path), path); !fresh)
      throw InputError(show_text(path, 300) + ": cannot write output: it is also " + show_text(it->second, 300) +
                       ", another output of this run");
  }
  // 1. Every file to a temporary of its own beside its place (O_EXCL: never an existing file or link).
  std::vector<std::string> temps;
  for (const auto& [path, bytes] : files_) {
    int fd = -1;
    std::string tmp;
    for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
      tmp = beside(path, "tmp");
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) throw InputError(show_text(path, 300) + ": cannot write output: " + std::strerror(errno));
    scratch.paths.push_back(tmp);
    temps.push_back(tmp);
    try {
      write_all(fd, bytes, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw InputError(show_text(path, 300) + ": cannot write output: " + std::strerror(errno));
  }
  // 2. Under an exclusive lock on each folder, taken once per folder (two spellings of one folder
  // would wait on themselves) and in one order (no deadlock between two runs), so another run's set
  // goes in wholly before or after this one: the files replaced kept aside (hard links), then every
  // temporary renamed into place in order (the tensor file before the JSON that names it). A rename
  // that fails puts back what was renamed before it.
  std::map<std::pair<dev_t, ino_t>, std::string> folders;
  for (const auto& [place, path] : places) folders.emplace(std::make_pair(place.dev, place.ino), folder_of(path));
  std::vector<int> locks;
  struct Unlock {
    std::vector<int>& fds;
    ~Unlock() {
      for (int fd : fds) ::close(fd);  // closing releases the lock
    }
  } unlock{locks};
  for (const auto& [id, folder] : folders) {
    const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    locks.push_back(fd);
  }
  std::vector<std::string> kept(files_.size());  // the replaced file's hard link, or "" when there was none
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& path = files_[i].first;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (!S_ISREG(st.st_mode))
      throw InputError(show_text(path, 300) + ": cannot write output: it became " + kind_of(st.st_mode) + " meanwhile");
    kept[i] = beside(path, "old");
    if (::link(path.c_str(), kept[i].c_str()) != 0) {
      kept[i].clear();
      throw InputError(show_text(path, 300) +
                       ": cannot write output: cannot keep the file it replaces: " + std::strerror(errno));
    }
    scratch.paths.push_back(kept[i]);
  }
  for (size_t i = 0; i < files_.size(); ++i) {
    if (::rename(temps[i].c_str(), files_[i].first.c_str()) == 0) continue;
    const std::string err = std::strerror(errno);
    for (size_t j = 0; j < i; ++j)  // back as they were
      if (kept[j].empty())
        ::unlink(files_[j].first.c_str());
      else
        ::rename(kept[j].c_str(), files_[j].first.c_str());
    throw InputError(show_text(files_[i].first, 300) + ": cannot write output: " + err +
                     (i ? " (the files of this set written before it were put back)" : ""));
  }
  files_.clear();
}

void write_output_file(const std::string& path, std::string bytes) {
  OutputFiles f;
  f.add(path, std::move(bytes));
  f.commit();
}

}  // namespace tparity
