#include "cli/stdout_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "core/error.h"

namespace dsaserve::cli {

void write_stdout(std::string_view s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::ferror(stdout))
    fail("cannot write to stdout: {}", std::strerror(errno));
}

void flush_stdout() {
  std::cout.flush();  // synced with stdio (the default): its writes are already in stdout's buffer
  // The reason: the flush's own errno when it fails; else an earlier write failed (stdout's error flag),
  // whose errno is the best account left of it.
  const int before = errno;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = flushed ? before : errno;
  if (!flushed || std::ferror(stdout) || !std::cout)
    fail("cannot write to stdout: {}", err != 0 ? std::strerror(err) : "write error");
}

}  // namespace dsaserve::cli
