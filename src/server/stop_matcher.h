#pragma once
// StopMatcher: stop strings over streamed text. Text that could still be the start of a stop string is
// held back until it either completes one (the output ends before it) or cannot anymore.
#include <string>
#include <string_view>
#include <vector>

namespace dsaserve::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});

  // Adds `text`; returns what may be emitted now. After a match, returns the text before the stop
  // string and matched() is true; later calls return nothing.
  std::string feed(std::string_view text);
  // The held-back text (at the end of the generation).
  std::string flush();
  bool matched() const { return matched_; }
  // Index into the stop list of the match (-1 without one).
  int matched_index() const { return matched_index_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
  int matched_index_ = -1;
};

}  // namespace dsaserve::server
