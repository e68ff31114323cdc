// The operator table (op_table.h) lists every operator of kernels::Backend and nothing else: read from
// src/kernels/ops.h itself, so that adding an operator to the interface without its CPU-twin cases in the
// table fails here, in CI (the cases themselves run on the GPU machine: cuda/op_table_test.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/fixtures.h"
#include "kernels/op_table.h"

namespace dsaserve::kernels::testing {
namespace {

// The virtual operators declared in the body of `class Backend` (not its destructor).
std::set<std::string> backend_operators(const std::string& header) {
  const size_t b = header.find("class Backend {");
  const size_t e = header.find("\n};", b);
  if (b == std::string::npos || e == std::string::npos) return {};
  const std::string body = header.substr(b, e - b);
  std::set<std::string> ops;
  const std::regex virt(R"(virtual\s+[^;{(]*?\b([A-Za-z_]\w*)\s*\()");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), virt); it != std::sregex_iterator(); ++it) {
    const auto at = (*it).position(1);
    if (at > 0 && body[size_t(at) - 1] == '~') continue;  // the destructor
    ops.insert((*it)[1].str());
  }
  return ops;
}

TEST(OpTable, ListsEveryBackendOperator) {
  std::ifstream f(dsaserve::testing::repo_dir() / "src/kernels/ops.h");
  ASSERT_TRUE(f) << "src/kernels/ops.h not found";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::set<std::string> declared = backend_operators(ss.str());
  ASSERT_GE(declared.size(), 20u) << "the Backend parse found too few operators";
  const std::vector<std::string> listed_v = op_table_ops();
  const std::set<std::string> listed(listed_v.begin(), listed_v.end());
  for (const std::string& op : declared) {
    EXPECT_TRUE(listed.count(op)) << "Backend::" << op << " has no case in tests/kernels/op_table.cpp";
  }
  for (const std::string& op : listed) {
    EXPECT_TRUE(declared.count(op)) << "the op table lists " << op << ", which Backend does not declare";
  }
}

TEST(OpTable, CasesAreNamedAndHaveChecks) {
  std::set<std::string> seen;
  for (const OpCase& c : op_table()) {
    EXPECT_FALSE(c.variant.empty()) << c.op;
    EXPECT_FALSE(c.tokens.empty()) << c.op << " " << c.variant;
    EXPECT_TRUE(c.make) << c.op << " " << c.variant;
    EXPECT_TRUE(seen.insert(c.op + " / " + c.variant).second)
        << "duplicate case " << c.op << " / " << c.variant;
  }
}

// The parse itself: a declaration spread over lines, a defaulted one, the destructor.
TEST(OpTable, BackendParseFindsMultiLineDeclarations) {
  const std::string h =
      "class Backend {\n public:\n  virtual ~Backend() = default;\n"
      "  virtual Tensor a(const Tensor& x) = 0;\n"
      "  virtual std::vector<Tensor> b_op(const Tensor& x,\n      const Fp8Act* q);\n"
      "  virtual void c(Tensor& t,\n const X& y) = 0;\n};\n"
      "class Other {\n  virtual void d();\n};\n";
  EXPECT_EQ(backend_operators(h), (std::set<std::string>{"a", "b_op", "c"}));
}

}  // namespace
}  // namespace dsaserve::kernels::testing
