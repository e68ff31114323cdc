#pragma once
// Errors raised while parsing or rendering a template. The message names the template line and column;
// kind says which jinja2 exception class the same failure raises in Python.
#include <string>

#include "core/error.h"

namespace dsaserve::chat {

enum class ErrorKind {
  kSyntax,     // TemplateSyntaxError (and TemplateAssertionError: unknown filter/test)
  kUndefined,  // UndefinedError
  kRuntime,    // TypeError, ValueError, ZeroDivisionError, ... raised while rendering
  kRaised,     // raise_exception() called by the template (TemplateError)
  kSecurity,   // SecurityError of the immutable sandbox (e.g. list.append)
};

const char* error_kind_name(ErrorKind kind);

class TemplateError : public dsaserve::Error {
 public:
  TemplateError(ErrorKind kind, int line, int column, const std::string& message);
  ErrorKind kind() const { return kind_; }
  int line() const { return line_; }
  int column() const { return column_; }
  // The message without the position prefix.
  const std::string& bare_message() const { return bare_; }

 private:
  ErrorKind kind_;
  int line_;
  int column_;
  std::string bare_;
};

// Thrown by value operations that do not know the template position yet; the interpreter rethrows
// it as TemplateError with the position of the expression being evaluated.
struct ValueError {
  ErrorKind kind;
  std::string message;
};

[[noreturn]] void throw_value_error(ErrorKind kind, std::string message);

}  // namespace dsaserve::chat
