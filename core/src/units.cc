#include "optiflow/core/units.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include <fmt/format.h>

namespace optiflow::core {

namespace {

constexpr std::size_t kMaxSizes = 4096;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

Diagnostic bad(std::string_view text, std::string_view why) {
  return Diagnostic{"", 0, 0, fmt::format("invalid size '{}': {}", text, why)};
}

}  // namespace

Result<std::uint64_t> parseSize(std::string_view text) {
  const std::string_view s = trim(text);
  double value = 0;
  const char* begin = s.data();
  const char* end = s.data() + s.size();
  std::uint64_t whole = 0;
  auto [p, ec] = std::from_chars(begin, end, whole);
  if (ec != std::errc() || p == begin) return bad(text, "expected a number such as 4096, 64KiB or 1GiB");
  value = static_cast<double>(whole);
  if (p != end && *p == '.') {
    // Fractions are allowed with a unit ("1.5MiB"); parse the digits by hand to stay locale-free.
    double scale = 0.1;
    ++p;
    const char* digits = p;
    while (p != end && std::isdigit(static_cast<unsigned char>(*p))) {
      value += (*p - '0') * scale;
      scale /= 10;
      ++p;
    }
    if (p == digits) return bad(text, "expected digits after the decimal point");
  }
  std::string unit(p, end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return bad(text, "unknown unit (expected B, KiB, MiB, GiB or TiB)");
  }
  const double bytes = value * mult;
  if (bytes > static_cast<double>(std::uint64_t{1} << 50)) return bad(text, "larger than 1 PiB");
  if (bytes != static_cast<double>(static_cast<std::uint64_t>(bytes))) {
    return bad(text, "not a whole number of bytes");
  }
  return static_cast<std::uint64_t>(bytes);
}

Result<std::vector<std::uint64_t>> parseSizeList(std::string_view text) {
  std::vector<std::uint64_t> out;
  std::string_view rest = text;
  if (trim(rest).empty()) return Diagnostic{"", 0, 0, "empty size list (expected e.g. 1KiB:1GiB)"};
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const std::size_t c1 = item.find(':');
    if (c1 == std::string_view::npos) {
      auto one = parseSize(item);
      if (!one) return one.error();
      out.push_back(*one);
    } else {
      const std::size_t c2 = item.find(':', c1 + 1);
      auto lo = parseSize(item.substr(0, c1));
      if (!lo) return lo.error();
      auto hi = parseSize(item.substr(c1 + 1, c2 == std::string_view::npos ? std::string_view::npos : c2 - c1 - 1));
      if (!hi) return hi.error();
      std::uint64_t factor = 2;
      if (c2 != std::string_view::npos) {
        const std::string_view f = trim(item.substr(c2 + 1));
        auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), factor);
        if (ec != std::errc() || p != f.data() + f.size() || factor < 2) {
          return Diagnostic{"", 0, 0, fmt::format("invalid size range '{}': the factor must be an integer >= 2", item)};
        }
      }
      if (*lo == 0 || *lo > *hi) {
        return Diagnostic{"", 0, 0, fmt::format("invalid size range '{}': expected MIN:MAX with 0 < MIN <= MAX", item)};
      }
      for (std::uint64_t s = *lo; s <= *hi; s *= factor) {
        out.push_back(s);
        if (out.size() > kMaxSizes) break;
        if (s > std::numeric_limits<std::uint64_t>::max() / factor) break;
      }
    }
    if (out.size() > kMaxSizes) return Diagnostic{"", 0, 0, fmt::format("more than {} sizes", kMaxSizes)};
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string formatSize(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{}B", bytes);
  if (v == static_cast<double>(static_cast<std::uint64_t>(v)))
    return fmt::format("{}{}", static_cast<std::uint64_t>(v), kUnits[u]);
  return fmt::format("{:.3g}{}", v, kUnits[u]);
}

}  // namespace optiflow::core
