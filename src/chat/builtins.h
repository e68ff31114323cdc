#pragma once
// Built-in filters, tests, attribute/method access and global functions of the interpreter
// (internal to the chat module). They throw ValueError; the interpreter adds the template position.
#include <string>

#include "chat/value.h"

namespace dsaserve::chat {

struct TemplateOptions;

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& operand, CallArgs& args, const TemplateOptions& o);
bool apply_test(const std::string& name, const Value& operand, CallArgs& args);

// jinja2 getattr(obj, name): methods first, then items (dicts), else undefined.
Value get_attribute(const Value& obj, const std::string& name, const TemplateOptions& o);
// jinja2 getitem(obj, key): items first, then attributes for string keys, else undefined.
Value get_item(const Value& obj, const Value& key, const TemplateOptions& o);
// obj[start:stop:step] for strings, lists and tuples (null parts are Undefined values).
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python iteration: list items, dict keys, string characters; undefined iterates as empty.
std::vector<Value> iterate(const Value& v);
// len(); throws for values without a length.
int64_t length_of(const Value& v);
// `item in container`.
bool contains(const Value& container, const Value& item);
// Python str methods by code point: len, indexing.
std::u32string code_points(const std::string& s);

// Python `format % args` (printf-style conversions s r d i x X o f F e E g G, %(key)s, %%).
std::string percent_format(const std::string& format, const Value& args);

// Globals every render sees: range, dict, namespace, and (transformers) raise_exception, strftime_now.
void add_globals(DictData& globals, const TemplateOptions& o);

// Raises UndefinedError if v is undefined (used where jinja2's Undefined raises).
void require_defined(const Value& v);

// Argument binding for built-ins: positional then keyword, defaults for the rest.
struct Param {
  const char* name;
  Value def;
  bool required = false;
};
std::vector<Value> bind_args(const char* fname, CallArgs& args, std::initializer_list<Param> params);

}  // namespace dsaserve::chat
