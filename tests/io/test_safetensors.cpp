// forge::io safetensors (src/forge/io/safetensors.h): bit-exact round trips of every dtype and
// layout, the exact on-disk layout of the format, files written by another writer, and one
// clear error (naming the file and the tensor) for each way a file can be corrupt.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/io_testing.h"
#include "testing/tensor_testing.h"

namespace forge::testing {
namespace {

using io::load_safetensors;
using io::save_safetensors;

const DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16,
                            DType::i32, DType::i64, DType::u8,   DType::boolean};

uint64_t read_u64(const std::string& s) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(s[static_cast<size_t>(i)]);
  return n;
}

TEST(Safetensors, RoundTripEveryDTypeAndShapeBitExact) {
  ScratchDir dir;
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint64_t seed = 1;
  for (DType dt : kAllDTypes) {
    const std::string n = dtype_name(dt);
    tensors.emplace_back(n + ".matrix", random_bits(dt, {3, 5}, seed++));
    tensors.emplace_back(n + ".scalar", random_bits(dt, {}, seed++));  // 0-d
    tensors.emplace_back(n + ".empty", random_bits(dt, {4, 0, 2}, seed++));
    tensors.emplace_back(n + ".cube", random_bits(dt, {2, 3, 4}, seed++));
  }
  save_safetensors(dir / "all.safetensors", tensors, {{"k", "v"}});

  const io::SafetensorsFile f = load_safetensors(dir / "all.safetensors");
  ASSERT_EQ(f.tensors.size(), tensors.size());
  size_t i = 0;
  for (const auto& [name, t] : f.tensors) {  // header order = the order given
    SCOPED_TRACE(name);
    EXPECT_EQ(name, tensors[i].first);
    const Tensor& want = tensors[i].second;
    EXPECT_EQ(t.dtype(), want.dtype());
    EXPECT_EQ(t.shape(), want.shape());
    EXPECT_TRUE(t.is_cpu());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_FALSE(t.requires_grad());
    EXPECT_EQ(bytes_of(t), bytes_of(want));
    ++i;
  }
  EXPECT_EQ(f.tensors.at("f32.scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("bf16.empty").numel(), 0);
}

TEST(Safetensors, NonContiguousTensorsAreSavedAsTheirValues) {
  ScratchDir dir;
  const Tensor base = random_bits(DType::f32, {4, 6}, 7);
  const Tensor transposed = base.t();                    // strides (1, 6)
  const Tensor stepped = base.slice(1, 1, 6, 2);         // every other column, offset 1
  const Tensor expanded = random_bits(DType::bf16, {1, 3}, 8).expand({5, 3});  // stride 0
  const Tensor picked = random_bits(DType::i64, {3, 4, 5}, 9).select(1, 2);  // offset into storage
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(stepped.is_contiguous());
  ASSERT_FALSE(expanded.is_contiguous());
  ASSERT_FALSE(picked.is_contiguous());
  save_safetensors(dir / "views.safetensors",
                   {{"t", transposed}, {"s", stepped}, {"e", expanded}, {"p", picked}});
  const auto f = load_safetensors(dir / "views.safetensors");
  for (const auto& [name, want] : std::vector<std::pair<std::string, Tensor>>{
           {"t", transposed}, {"s", stepped}, {"e", expanded}, {"p", picked}}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(f.tensors.at(name).shape(), want.shape());
    EXPECT_EQ(bytes_of(f.tensors.at(name)), bytes_of(want));
  }
}

TEST(Safetensors, TensorsThatRequireGradAreSavedDetached) {
  ScratchDir dir;
  Tensor w = randn({3, 3}, {.requires_grad = true});
  Tensor y = w * 2.0;  // a non-leaf with history
  save_safetensors(dir / "g.safetensors", {{"w", w}, {"y", y}});
  const auto f = load_safetensors(dir / "g.safetensors");
  EXPECT_EQ(vals(f.tensors.at("w")), vals(w));
  EXPECT_EQ(vals(f.tensors.at("y")), vals(y));
  EXPECT_FALSE(f.tensors.at("y").requires_grad());
}

TEST(Safetensors, MetadataRoundTrips) {
  ScratchDir dir;
  const io::SafetensorsMetadata meta{{"format", "pt"}, {"note", "héllo \"quoted\"\n"}, {"", "empty key"}};
  save_safetensors(dir / "m.safetensors", {{"x", ones({2})}}, meta);
  EXPECT_EQ(load_safetensors(dir / "m.safetensors").metadata, meta);
  EXPECT_EQ(io::read_safetensors_header(dir / "m.safetensors").metadata, meta);

  save_safetensors(dir / "none.safetensors", {{"x", ones({2})}});
  EXPECT_TRUE(load_safetensors(dir / "none.safetensors").metadata.empty());
  EXPECT_EQ(slurp(dir / "none.safetensors").find("__metadata__"), std::string::npos);
}

TEST(Safetensors, OnDiskLayoutFollowsTheSpec) {
  ScratchDir dir;
  const Tensor a = from_vector<float>({1.0f, -2.5f, 3.0f}, {3});
  const Tensor b = from_vector<int64_t>({-1, 1LL << 40}, {2, 1});
  const Tensor c = from_vector<uint8_t>({7}, {});
  // Given order z, a, m: not alphabetical; the file keeps it.
  save_safetensors(dir / "l.safetensors", {{"z", a}, {"a", b}, {"m", c}}, {{"who", "forge"}});
  const std::string bytes = slurp(dir / "l.safetensors");
  const uint64_t n = read_u64(bytes);
  ASSERT_GE(bytes.size(), 8 + n);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u) << "at most 7 spaces of padding";

  const auto j = nlohmann::ordered_json::parse(header);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "z", "a", "m"}));
  EXPECT_EQ(j["__metadata__"]["who"], "forge");
  EXPECT_EQ(j["z"]["dtype"], "F32");
  EXPECT_EQ(j["z"]["shape"], nlohmann::ordered_json({3}));
  EXPECT_EQ(j["z"]["data_offsets"], nlohmann::ordered_json({0, 12}));
  EXPECT_EQ(j["a"]["dtype"], "I64");
  EXPECT_EQ(j["a"]["shape"], nlohmann::ordered_json({2, 1}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::ordered_json({12, 28}));
  EXPECT_EQ(j["m"]["dtype"], "U8");
  EXPECT_EQ(j["m"]["shape"], nlohmann::ordered_json::array());
  EXPECT_EQ(j["m"]["data_offsets"], nlohmann::ordered_json({28, 29}));
  ASSERT_EQ(bytes.size(), 8 + n + 29);

  // Raw little-endian values.
  const std::string data = bytes.substr(8 + n);
  float f[3];
  std::memcpy(f, data.data(), 12);
  EXPECT_EQ(f[1], -2.5f);
  EXPECT_EQ(static_cast<uint8_t>(data[12]), 0xFF);  // -1 little-endian
  EXPECT_EQ(static_cast<uint8_t>(data[20 + 5]), 0x01);  // 1 << 40: byte 5
  EXPECT_EQ(static_cast<uint8_t>(data[28]), 7);
}

TEST(Safetensors, DTypeNames) {
  const std::pair<DType, const char*> names[] = {{DType::f32, "F32"}, {DType::f64, "F64"}, {DType::bf16, "BF16"},
                                                 {DType::f16, "F16"}, {DType::i32, "I32"}, {DType::i64, "I64"},
                                                 {DType::u8, "U8"},   {DType::boolean, "BOOL"}};
  for (const auto& [dt, name] : names) {
    EXPECT_STREQ(io::safetensors_dtype_name(dt), name);
    EXPECT_EQ(io::parse_safetensors_dtype(name), dt);
  }
  EXPECT_NE(error_of([] { io::parse_safetensors_dtype("I16"); }).find("does not support"), std::string::npos);
  EXPECT_NE(error_of([] { io::parse_safetensors_dtype("f32"); }).find("unknown dtype 'f32'"), std::string::npos);
}

TEST(Safetensors, ReadsAFileFromAnotherWriter) {
  // As the Python library writes them: keys sorted in the header, data in another order
  // (largest alignment first), spaces after the JSON, metadata last.
  ScratchDir dir;
  const float a[2] = {1.5f, -0.0f};
  const int32_t b[3] = {7, -8, 1 << 30};
  const uint16_t c[1] = {0x3F80};  // bf16 1.0
  const uint8_t d[2] = {1, 0};
  std::string data;
  data.append(reinterpret_cast<const char*>(b), 12);  // [0, 12)
  data.append(reinterpret_cast<const char*>(a), 8);   // [12, 20)
  data.append(reinterpret_cast<const char*>(c), 2);   // [20, 22)
  data.append(reinterpret_cast<const char*>(d), 2);   // [22, 24)
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
      R"("b":{"dtype":"I32","shape":[3,1],"data_offsets":[0,12]},)"
      R"("c":{"dtype":"BF16","shape":[],"data_offsets":[20,22]},)"
      R"("d":{"dtype":"BOOL","shape":[2],"data_offsets":[22,24]},)"
      R"("e":{"dtype":"F64","shape":[0,3],"data_offsets":[24,24]},)"
      R"("__metadata__":{"format":"pt"}})";
  spit(dir / "other.safetensors", raw_safetensors(header, data, 13));

  const auto f = load_safetensors(dir / "other.safetensors");
  std::vector<std::string> order;
  for (const auto& [name, t] : f.tensors) order.push_back(name);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(vals(f.tensors.at("a")), (std::vector<double>{1.5, 0.0}));
  EXPECT_TRUE(std::signbit(vals(f.tensors.at("a"))[1]));
  EXPECT_EQ(f.tensors.at("b").shape(), (Shape{3, 1}));
  EXPECT_EQ(vals(f.tensors.at("b")), (std::vector<double>{7, -8, 1 << 30}));
  EXPECT_EQ(f.tensors.at("c").dtype(), DType::bf16);
  EXPECT_EQ(f.tensors.at("c").item<double>(), 1.0);
  EXPECT_EQ(f.tensors.at("d").dtype(), DType::boolean);
  EXPECT_EQ(vals(f.tensors.at("d")), (std::vector<double>{1, 0}));
  EXPECT_EQ(f.tensors.at("e").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.metadata.at("format"), "pt");

  const auto h = io::read_safetensors_header(dir / "other.safetensors");
  ASSERT_EQ(h.entries.size(), 5u);
  EXPECT_EQ(h.entries[0].name, "a");
  EXPECT_EQ(h.entries[0].begin, 12u);
  EXPECT_EQ(h.data_start, 8 + header.size() + 13);
}

TEST(Safetensors, AnEmptyFileHoldsNoTensors) {
  ScratchDir dir;
  save_safetensors(dir / "e.safetensors", std::vector<std::pair<std::string, Tensor>>{});
  EXPECT_EQ(slurp(dir / "e.safetensors").size(), 16u);  // length + "{}" + 6 spaces
  EXPECT_TRUE(load_safetensors(dir / "e.safetensors").tensors.empty());
}

TEST(Safetensors, SaveRefusesBadNamesAndLeavesNoFile) {
  ScratchDir dir;
  const fs::path p = dir / "bad.safetensors";
  std::string e = error_of([&] { save_safetensors(p, {{"x", ones({1})}, {"x", zeros({1})}}); });
  EXPECT_NE(e.find("duplicate tensor name 'x'"), std::string::npos) << e;
  EXPECT_NE(e.find(p.string()), std::string::npos) << e;
  e = error_of([&] { save_safetensors(p, {{"__metadata__", ones({1})}}); });
  EXPECT_NE(e.find("reserved"), std::string::npos) << e;
  e = error_of([&] { save_safetensors(p, {{"", ones({1})}}); });
  EXPECT_NE(e.find("empty tensor name"), std::string::npos) << e;
  e = error_of([&] { save_safetensors(p, {{"u", Tensor()}}); });
  EXPECT_NE(e.find("tensor 'u' is undefined"), std::string::npos) << e;
  e = error_of([&] { save_safetensors(p, {{"bad\xff", ones({1})}}); });
  EXPECT_NE(e.find("cannot encode the header"), std::string::npos) << e;
  EXPECT_TRUE(listing(dir.path()).empty());
}

TEST(Safetensors, NamedTensorsKeepOrderAndRefuseDuplicates) {
  io::NamedTensors nt{{"b", ones({1})}, {"a", zeros({2})}};
  nt.insert("c", ones({3}));
  std::vector<std::string> order;
  for (const auto& [name, t] : nt) order.push_back(name);
  EXPECT_EQ(order, (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_TRUE(nt.contains("a"));
  EXPECT_EQ(nt.find("zz"), nullptr);
  EXPECT_EQ(nt.at("c").numel(), 3);
  EXPECT_NE(error_of([&] { nt.insert("a", ones({1})); }).find("duplicate tensor name 'a'"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)nt.at("q"); }).find("no tensor named 'q'"), std::string::npos);
}

// ---- corrupt files ------------------------------------------------------------------------

class SafetensorsCorrupt : public ::testing::Test {
 protected:
  // Writes `bytes` to a file and returns load_safetensors' error (asserting it names the file).
  // `header_too`: read_safetensors_header must refuse it as well (all but value checks).
  std::string load_error(const std::string& bytes, bool header_too = true) {
    const fs::path p = dir_ / (std::to_string(count_++) + ".safetensors");
    spit(p, bytes);
    const std::string e = error_of([&] { load_safetensors(p); });
    EXPECT_NE(e.find(p.string()), std::string::npos) << "error does not name the file: " << e;
    if (header_too) {
      const std::string e2 = error_of([&] { io::read_safetensors_header(p); });
      EXPECT_NE(e2, "<no error>") << "read_safetensors_header accepted what load_safetensors refused";
    }
    return e;
  }
  // Strings are built by appending: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
  static std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                           uint64_t begin, uint64_t end) {
    std::string s = "\"";
    for (const std::string& part : {name, std::string("\":{\"dtype\":\""), dtype, std::string("\",\"shape\":"), shape,
                                    std::string(",\"data_offsets\":["), std::to_string(begin), std::string(","),
                                    std::to_string(end), std::string("]}")})
      s += part;
    return s;
  }
  // {"<entry>", "<entry>"} -> "{<entry>,<entry>}"
  static std::string obj(std::initializer_list<std::string> entries) {
    std::string s = "{";
    for (const std::string& e : entries) {
      if (s.size() > 1) s += ',';
      s += e;
    }
    s += '}';
    return s;
  }
  ScratchDir dir_;
  int count_ = 0;
};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST_F(SafetensorsCorrupt, TruncatedAtEveryStage) {
  save_safetensors(dir_ / "good.safetensors",
                   {{"alpha", random_bits(DType::f32, {4, 4}, 1)}, {"beta", random_bits(DType::i64, {3}, 2)}});
  const std::string good = slurp(dir_ / "good.safetensors");
  const uint64_t n = read_u64(good);
  const size_t cuts[] = {0, 3, 7, 8, 9, static_cast<size_t>(8 + n / 2), static_cast<size_t>(8 + n - 1),
                         static_cast<size_t>(8 + n), static_cast<size_t>(8 + n + 10), good.size() - 1};
  for (size_t cut : cuts) {
    SCOPED_TRACE(forge::detail::concat("cut at ", cut, " of ", good.size()));
    const std::string e = load_error(good.substr(0, cut));
    EXPECT_HAS(e, "truncated");
  }
  // The data-section cuts name the tensor that runs past the end.
  EXPECT_HAS(load_error(good.substr(0, good.size() - 1)), "tensor 'beta'");
  EXPECT_HAS(load_error(good.substr(0, 8 + n + 10)), "tensor 'alpha'");
}

TEST_F(SafetensorsCorrupt, HeaderLength) {
  std::string huge = raw_safetensors("{}", "");
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>(i == 7 ? 0x7F : 0xFF);
  EXPECT_HAS(load_error(huge), "implausibly large");
  std::string beyond = raw_safetensors("{}", "");
  beyond[0] = 100;
  EXPECT_HAS(load_error(beyond), "runs past the end of the file");
  std::string zero(8, '\0');
  zero += "{}";
  EXPECT_HAS(load_error(zero), "header length is 0");
}

TEST_F(SafetensorsCorrupt, BadJson) {
  EXPECT_HAS(load_error(raw_safetensors("{\"a\": {\"dtype\": \"F32\",", "")), "not valid JSON");
  EXPECT_HAS(load_error(raw_safetensors("{\"a\": 1} trailing", "")), "not valid JSON");
  EXPECT_HAS(load_error(raw_safetensors("[1, 2]", "")), "does not start with '{'");
  EXPECT_HAS(load_error(raw_safetensors(" {}", "")), "does not start with '{'");
  EXPECT_HAS(load_error(raw_safetensors("{\"bad\xff\": 1}", "")), "not valid JSON");  // not UTF-8
  EXPECT_HAS(load_error(raw_safetensors("{\"a\": 3}", "")), "tensor 'a': expected an object");
}

TEST_F(SafetensorsCorrupt, DuplicateNames) {
  const std::string h = obj({entry("w", "U8", "[2]", 0, 2), entry("w", "U8", "[2]", 2, 4)});
  EXPECT_HAS(load_error(raw_safetensors(h, "abcd")), "duplicate key 'w'");
  const std::string f = R"({"w":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_HAS(load_error(raw_safetensors(f, "a")), "duplicate key 'dtype'");
}

TEST_F(SafetensorsCorrupt, BadDTypesShapesAndFields) {
  std::string e = load_error(raw_safetensors(obj({entry("w", "Q7", "[1]", 0, 1)}), "a"));
  EXPECT_HAS(e, "tensor 'w'");
  EXPECT_HAS(e, "unknown dtype 'Q7'");
  e = load_error(raw_safetensors(obj({entry("w", "I16", "[1]", 0, 2)}), "ab"));
  EXPECT_HAS(e, "'I16' is a safetensors dtype forge does not support");
  EXPECT_HAS(load_error(raw_safetensors(obj({entry("w", "U8", "[-1]", 0, 1)}), "a")), "non-negative integers");
  EXPECT_HAS(load_error(raw_safetensors(obj({entry("w", "U8", "[1.5]", 0, 1)}), "a")), "non-negative integers");
  EXPECT_HAS(load_error(raw_safetensors(obj({entry("w", "U8", "2", 0, 2)}), "ab")), "shape must be an array");
  EXPECT_HAS(load_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1]}})", "a")), "missing field 'data_offsets'");
  EXPECT_HAS(load_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", "a")),
             "unknown field 'x'");
  EXPECT_HAS(load_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "a")),
             "data_offsets must be [begin, end]");
  EXPECT_HAS(load_error(raw_safetensors(R"({"__metadata__":{"a":1}})", "")), "__metadata__ value of 'a'");
  EXPECT_HAS(load_error(raw_safetensors(R"({"__metadata__":[]})", "")), "__metadata__ must be an object");
  const std::string huge = obj({entry("w", "F64", "[4294967296,4294967296,4294967296]", 0, 8)});
  EXPECT_HAS(load_error(raw_safetensors(huge, std::string(8, 'x'))), "overflows");
}

TEST_F(SafetensorsCorrupt, BadOffsets) {
  // Size does not match shape x dtype.
  std::string e = load_error(raw_safetensors(obj({entry("w", "F32", "[2,3]", 0, 20)}), std::string(20, 'x')));
  EXPECT_HAS(e, "tensor 'w'");
  EXPECT_HAS(e, "F32 [2, 3] needs 24 bytes but data_offsets [0, 20] hold 20");
  // Overlap.
  e = load_error(raw_safetensors(obj({entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[4]", 2, 6)}),
                                 std::string(6, 'x')));
  EXPECT_HAS(e, "tensor 'b'");
  EXPECT_HAS(e, "overlap tensor 'a'");
  // Out of range.
  e = load_error(raw_safetensors(obj({entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[4]", 4, 8)}),
                                 std::string(6, 'x')));
  EXPECT_HAS(e, "tensor 'b'");
  EXPECT_HAS(e, "run past the end of the data section (6 bytes)");
  // Gap.
  e = load_error(raw_safetensors(obj({entry("a", "U8", "[2]", 0, 2), entry("b", "U8", "[2]", 4, 6)}),
                                 std::string(6, 'x')));
  EXPECT_HAS(e, "tensor 'b'");
  EXPECT_HAS(e, "gap of 2 bytes after tensor 'a'");
  // Trailing data.
  e = load_error(raw_safetensors(obj({entry("a", "U8", "[2]", 0, 2)}), std::string(5, 'x')));
  EXPECT_HAS(e, "3 bytes of trailing data");
  // End before begin.
  e = load_error(raw_safetensors(obj({entry("a", "U8", "[0]", 3, 1)}), std::string(3, 'x')));
  EXPECT_HAS(e, "end before they begin");
}

TEST_F(SafetensorsCorrupt, BoolBytesMustBeZeroOrOne) {
  const std::string e = load_error(raw_safetensors(obj({entry("mask", "BOOL", "[3]", 0, 3)}), std::string("\x01\x00\x02", 3)),
                                 /*header_too=*/false);
  EXPECT_HAS(e, "tensor 'mask'");
  EXPECT_HAS(e, "byte value 2");
}

TEST_F(SafetensorsCorrupt, MissingFileAndDirectory) {
  std::string e = error_of([&] { load_safetensors(dir_ / "nope.safetensors"); });
  EXPECT_HAS(e, (dir_ / "nope.safetensors").string());
  EXPECT_HAS(e, "No such file");
  e = error_of([&] { load_safetensors(dir_.path()); });
  EXPECT_HAS(e, "not a regular file");
}

}  // namespace
}  // namespace forge::testing
