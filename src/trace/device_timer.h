#pragma once
// Device timing of op spans: a pair of CUDA events recorded around a span on the legacy default stream,
// which orders with the blocking compute stream the CUDA operators launch on (kernels/cuda/common/
// device_context.h), resolved later without a synchronisation per op. Built with CUDA (DSASERVE_CUDA,
// device_timer_cuda.cpp) or without it (device_timer_none.cpp: available() is false and spans keep their
// wall-clock times).
//
// GPU times are placed on the recorder's clock through an anchor event: the first span after every
// earlier one was resolved records an anchor together with the host time; a span's start is that host
// time plus the GPU time from the anchor to its start event. (If the GPU was still busy with earlier
// work when the anchor was recorded, starts are early by that backlog; durations are exact.)
#include <string>

namespace dsaserve::trace::device {

struct Mark;  // opaque: one span's start/end events and its anchor

// Whether this build times spans with CUDA events.
bool available();
// Records a start event now (host time `host_us` on the recorder's clock). Null when the events cannot
// be created or recorded (the span then keeps its wall-clock time; `why` says what failed).
Mark* begin(double host_us, std::string* why);
// Records the end event (no synchronisation). Errors are kept and reported by times().
void end(Mark* m);
// True when the end event has completed (never blocks).
bool ready(Mark* m);
// Waits for the end event, then the span's start (recorder clock) and duration in microseconds. False
// (with `why`) on a CUDA error.
bool times(Mark* m, double* start_us, double* dur_us, std::string* why);
// Returns the events to the pool.
void release(Mark* m);

}  // namespace dsaserve::trace::device
