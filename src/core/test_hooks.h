// The test hooks the shipped binary obeys, each read from the environment when its part starts
// and announced on stderr when set (SECURITY.md, "Test hooks", says why they are compiled into
// release builds and why that is harmless):
//   DELTAFIN_FAULT                  read and allocation faults (core/fault_inject.h);
//   DELTAFIN_DEBUG_STEP_DELAY_MS=N  the server's engine thread sleeps N ms (0..60000) after
//                                   every step, so tests can hold a request mid-stream (client
//                                   disconnects, time limits, keep-alives, the page at 0.2
//                                   tokens/s);
//   DELTAFIN_DEBUG_SCRIPT=TEXT      the server answers every request with TEXT's tokens instead
//                                   of the model's (tests drive real agents through whole turns
//                                   with a tiny random model; server/scheduler.cpp).
// All are read with secure_getenv (test_hook_env): a process running with raised privileges
// (setuid, setgid, file capabilities) ignores them.
#pragma once

namespace deltafin {

// DELTAFIN_DEBUG_STEP_DELAY_MS, clamped to 0..60000, read now (the server's scheduler reads it
// once, when it starts); 0 when unset or not a number.
int debug_step_delay_ms();

// The value of a test hook's variable, or null when unset, empty or ignored (raised privileges).
const char* test_hook_env(const char* name);

}  // namespace deltafin
