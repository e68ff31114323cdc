#include "server/stop_matcher.h"

#include <algorithm>

namespace dsaserve::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::feed(std::string_view text) {
  if (matched_) return {};
  if (stops_.empty()) return std::string(text);
  pending_ += text;
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos != std::string::npos && (best == std::string::npos || pos < best)) {
      best = pos;
      matched_index_ = int(i);
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace dsaserve::server
