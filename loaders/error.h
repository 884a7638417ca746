// The one error type for bad input and failed I/O: its message is the single line the user sees
// after "nibble: error: ", so it names the file or tensor and the values that were wrong.
#pragma once
#include <stdexcept>
#include <string>

namespace nibble {

// `s` with every control character escaped (\n, \r, \t, \0, \xNN), so that a name taken from a
// model (a tensor name or location holding a newline or a NUL) cannot break the one-line message.
std::string one_line(const std::string& s);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(one_line(what)) {}
};

// errno text for messages about system calls.
std::string errno_text(int err);

}  // namespace nibble
