#pragma once
// The commands' output on stdout. SIGPIPE is ignored (main.cpp), so a reader that went away or a full device
// is a write error: it ends the command with "cannot write to stdout: <reason>" and exit status 1, never a
// silent success with truncated output nor a loop over stdin for nobody.
#include <string_view>

namespace dsaserve::cli {

// Writes s to stdout; throws dsaserve::Error when the write fails or stdout is already in error.
void write_stdout(std::string_view s);
// Flushes stdout (and std::cout, which shares its buffer); throws dsaserve::Error when that fails.
void flush_stdout();

}  // namespace dsaserve::cli
