// Built without CUDA: no device timing (trace/device_timer.h); spans keep their wall-clock times.
#include "trace/device_timer.h"

namespace dsaserve::trace::device {

bool available() { return false; }
Mark* begin(double, std::string* why) {
  if (why != nullptr) *why = "built without CUDA";
  return nullptr;
}
void end(Mark*) {}
bool ready(Mark*) { return true; }
bool times(Mark*, double*, double*, std::string* why) {
  if (why != nullptr) *why = "built without CUDA";
  return false;
}
void release(Mark*) {}

}  // namespace dsaserve::trace::device
