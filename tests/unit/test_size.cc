// parse_size: one meaning of a size for every flag that takes one (SI names powers of 1000, IEC names
// powers of 1024), and one error line naming the flag for anything else.
#include <gtest/gtest.h>

#include "host/text.h"
#include "loaders/error.h"

using namespace nibble;

TEST(Size, UnitTable) {
  const struct {
    const char* text;
    uint64_t bytes;
  } table[] = {
      {"65536", 65536},
      {"4096b", 4096},
      {"1KB", 1000},
      {"1kb", 1000},
      {"1K", 1000},
      {"1KiB", 1024},
      {"1Ki", 1024},
      {"300MB", 300000000},
      {"300MiB", 314572800},
      {"1GB", 1000000000},
      {"1G", 1000000000},
      {"1GiB", 1073741824},
      {"1.5 GiB", 1610612736},
      {"8gib", 8589934592},
      {"2TB", 2000000000000},
      {"2TiB", 2199023255552},
      {"0.5KiB", 512},
  };
  for (const auto& row : table) EXPECT_EQ(parse_size(row.text, "--device_memory"), row.bytes) << row.text;
}

TEST(Size, BadInputIsOneLineNamingTheFlag) {
  for (const char* bad : {"", "GiB", "lots", "300XB", "1GiBs", "1 iB", "-1GB", "0", "0MiB", "nan", "inf"}) {
    try {
      parse_size(bad, "--device_memory");
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(std::string("--device_memory '") + bad + "' is not a size", 0), 0u) << m;
      EXPECT_NE(m.find("powers of 1000"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(parse_size("20000000TiB", "--device_memory"), Error);
}
