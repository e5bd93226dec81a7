// The namelist reader: every value kind, lists, comments, names, quoting, and
// every syntax error with the line it names.
#include <gtest/gtest.h>

#include "comm/check.hpp"
#include "io/namelist.hpp"

namespace {

using ddp::nml::Kind;

// The message of the InputError parse() throws, or "" if it parses.
std::string error_of(const std::string& text) {
  try {
    ddp::nml::parse(text, "x.nml");
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "";
}

const ddp::nml::Entry& entry(const ddp::nml::Group& g, const std::string& key) {
  for (const auto& e : g.entries)
    if (e.key == key) return e;
  throw std::runtime_error("no key " + key);
}

TEST(Namelist, EveryValueKind) {
  const auto groups = ddp::nml::parse(
      "&g\n"
      "  i = 42, neg = -7, plus = +3\n"
      "  r1 = 1.0e-3, r2 = 1.d-3, r3 = 1.D3, r4 = .5, r5 = 5., r6 = -2.5E+2\n"
      "  l1 = .true., l2 = .false., l3 = T, l4 = F, l5 = .t., l6 = true, l7 = false, l8 = .F.\n"
      "  s1 = 'single', s2 = \"double\"\n"
      "/\n",
      "x.nml");
  ASSERT_EQ(groups.size(), 1u);
  const auto& g = groups[0];
  EXPECT_EQ(g.name, "g");
  EXPECT_EQ(g.line, 1);

  const auto& i = entry(g, "i").values.at(0);
  EXPECT_EQ(i.kind, Kind::Int);
  EXPECT_EQ(i.i, 42);
  EXPECT_EQ(i.text, "42");
  EXPECT_EQ(i.line, 2);
  EXPECT_EQ(entry(g, "neg").values.at(0).i, -7);
  EXPECT_EQ(entry(g, "plus").values.at(0).i, 3);

  const std::vector<std::pair<std::string, double>> reals = {{"r1", 1e-3}, {"r2", 1e-3}, {"r3", 1e3},
                                                             {"r4", 0.5},  {"r5", 5.0},  {"r6", -250.0}};
  for (const auto& [key, want] : reals) {
    const auto& v = entry(g, key).values.at(0);
    EXPECT_EQ(v.kind, Kind::Real) << key;
    EXPECT_DOUBLE_EQ(v.r, want) << key;
    EXPECT_EQ(v.line, 3) << key;
  }
  EXPECT_EQ(entry(g, "r2").values.at(0).text, "1.d-3");

  const std::vector<std::pair<std::string, bool>> logicals = {{"l1", true},  {"l2", false}, {"l3", true},
                                                              {"l4", false}, {"l5", true},  {"l6", true},
                                                              {"l7", false}, {"l8", false}};
  for (const auto& [key, want] : logicals) {
    const auto& v = entry(g, key).values.at(0);
    EXPECT_EQ(v.kind, Kind::Logical) << key;
    EXPECT_EQ(v.b, want) << key;
  }

  EXPECT_EQ(entry(g, "s1").values.at(0).kind, Kind::String);
  EXPECT_EQ(entry(g, "s1").values.at(0).s, "single");
  EXPECT_EQ(entry(g, "s2").values.at(0).s, "double");
  EXPECT_EQ(entry(g, "s2").values.at(0).text, "\"double\"");
}

TEST(Namelist, ListsSpanLinesWithComments) {
  const auto groups = ddp::nml::parse(
      "! leading comment\n"
      "&model layers = 'linear(256)', 'relu',  ! two layers here\n"
      "                'linear(10)'\n"
      "       sizes = 1, 2\n"
      "               3\n"
      "/\n",
      "x.nml");
  const auto& layers = entry(groups.at(0), "layers");
  ASSERT_EQ(layers.values.size(), 3u);
  EXPECT_EQ(layers.values[0].s, "linear(256)");
  EXPECT_EQ(layers.values[1].s, "relu");
  EXPECT_EQ(layers.values[2].s, "linear(10)");
  EXPECT_EQ(layers.values[2].line, 3);
  const auto& sizes = entry(groups.at(0), "sizes");
  ASSERT_EQ(sizes.values.size(), 3u);
  EXPECT_EQ(sizes.values[2].i, 3);
  EXPECT_EQ(sizes.line, 4);
}

TEST(Namelist, SeveralGroupsAndTerminators) {
  const auto groups = ddp::nml::parse(
      "&a x = 1 /\n"
      "&b y = 2\n"
      "&end\n"
      "$c z = 3 $end\n"
      "&d /\n",
      "x.nml");
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].name, "a");
  EXPECT_EQ(groups[1].name, "b");
  EXPECT_EQ(groups[1].line, 2);
  EXPECT_EQ(groups[2].name, "c");
  EXPECT_EQ(entry(groups[2], "z").values.at(0).i, 3);
  EXPECT_EQ(groups[3].name, "d");
  EXPECT_TRUE(groups[3].entries.empty());
}

TEST(Namelist, NamesAreCaseInsensitive) {
  const auto groups = ddp::nml::parse("&TRAIN Batch_Size = 4, LR = 1.0 /", "x.nml");
  EXPECT_EQ(groups.at(0).name, "train");
  EXPECT_EQ(groups.at(0).entries.at(0).key, "batch_size");
  EXPECT_EQ(groups.at(0).entries.at(1).key, "lr");
}

TEST(Namelist, QuotesHoldCommasParenthesesAndComments) {
  const auto groups = ddp::nml::parse(
      "&g a = 'conv(8, 3), relu ! not a comment', b = 'it''s', c = \"say \"\"hi\"\"\", "
      "d = \"it's\", e = '/' /",
      "x.nml");
  const auto& g = groups.at(0);
  ASSERT_EQ(entry(g, "a").values.size(), 1u);
  EXPECT_EQ(entry(g, "a").values[0].s, "conv(8, 3), relu ! not a comment");
  EXPECT_EQ(entry(g, "b").values[0].s, "it's");
  EXPECT_EQ(entry(g, "c").values[0].s, "say \"hi\"");
  EXPECT_EQ(entry(g, "d").values[0].s, "it's");
  EXPECT_EQ(entry(g, "e").values[0].s, "/");
}

TEST(Namelist, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(error_of("&g\n  a = 1\n  s = 'abc\n/"), "x.nml:3: unterminated string");
  EXPECT_EQ(error_of("\n&train\n  lr = 1\n"), "x.nml:3: missing '/' closing &train opened at line 2");
  EXPECT_EQ(error_of("&train lr = 1\n&io x = 2 /"), "x.nml:2: missing '/' closing &train opened at line 1");
  EXPECT_EQ(error_of("&train\n epochs = 1\n lr 0.1 /"), "x.nml:3: expected '=' after 'lr'");
  EXPECT_EQ(error_of("&g\n a = 1\n a = 2 /"), "x.nml:3: duplicate key 'a' in &g (first at line 2)");
  EXPECT_EQ(error_of("&g\n a = 1\n B = 2, b = 3 /"), "x.nml:3: duplicate key 'b' in &g (first at line 3)");
  EXPECT_EQ(error_of("&g a = 1 /\nstray text\n"), "x.nml:2: text outside a group: 'stray'");
  EXPECT_EQ(error_of("# hash comment\n&g a = 1 /"), "x.nml:1: unexpected character '#'");
  EXPECT_EQ(error_of("&g\n a = ,\n b = 1 /"), "x.nml:2: missing value for 'a'");
  EXPECT_EQ(error_of("&g\n a =\n/"), "x.nml:2: missing value for 'a'");
  EXPECT_EQ(error_of("&g\n a = 1,, 2 /"), "x.nml:2: empty value in the list of 'a'");
  EXPECT_EQ(error_of("&g\n a = 1, b 2 /"), "x.nml:2: expected '=' after 'b'");
  EXPECT_EQ(error_of("&g\n a = 'x',\n     relu /"),
            "x.nml:3: expected a value for 'a', got 'relu' (strings need quotes)");
  EXPECT_EQ(error_of("&g\n opt = adam /"),
            "x.nml:2: expected a value for 'opt', got 'adam' (strings need quotes)");
  EXPECT_EQ(error_of("&g\n\n lr = 1.2.3 /"), "x.nml:3: invalid value '1.2.3' for 'lr'");
  EXPECT_EQ(error_of("&g\n lr = 1e /"), "x.nml:2: invalid value '1e' for 'lr'");
  EXPECT_EQ(error_of("&g\n n = 99999999999999999999 /"),
            "x.nml:2: invalid value '99999999999999999999' for 'n'");
  EXPECT_EQ(error_of("&g\n a(1) = 2 /"), "x.nml:2: unexpected character '('");
  EXPECT_EQ(error_of("&g\n 1a = 2 /"), "x.nml:2: invalid key name '1a'");
  EXPECT_EQ(error_of("& g a = 1 /"), "x.nml:1: expected a group name after '&'");
  EXPECT_EQ(error_of("&g\n = 2 /"), "x.nml:2: expected a key in &g, got '='");
  EXPECT_EQ(error_of("&g\n 'a' = 2 /"), "x.nml:2: expected a key in &g, got ''a''");
}

TEST(Namelist, EmptyAndCommentOnlyTextHasNoGroups) {
  EXPECT_TRUE(ddp::nml::parse("", "x.nml").empty());
  EXPECT_TRUE(ddp::nml::parse("  ! only a comment\n\n", "x.nml").empty());
}

TEST(Namelist, Helpers) {
  EXPECT_EQ(ddp::nml::quote("it's"), "'it''s'");
  EXPECT_EQ(ddp::nml::unquote("'it''s'").value(), "it's");
  EXPECT_EQ(ddp::nml::unquote("\"a,b\"").value(), "a,b");
  EXPECT_FALSE(ddp::nml::unquote("'a'b'").has_value());
  EXPECT_FALSE(ddp::nml::unquote("plain").has_value());
  EXPECT_EQ(ddp::nml::split_list("conv(8,3), relu ,'a,b'"),
            (std::vector<std::string>{"conv(8,3)", "relu", "'a,b'"}));
  EXPECT_TRUE(ddp::nml::split_list("  ").empty());
  EXPECT_FALSE(ddp::nml::parse_literal("abc").has_value());
  EXPECT_EQ(ddp::nml::parse_literal("1.D-2")->kind, Kind::Real);
  EXPECT_DOUBLE_EQ(ddp::nml::parse_literal("1.D-2")->r, 0.01);
}

}  // namespace
