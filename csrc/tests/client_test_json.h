// A small JSON reader for the C++ client's tests only: it reads
// tests/data/golden/manifest.json, which describes each golden frame. The
// client library itself needs no JSON reader (it writes its one JSON object
// by hand), and the tests should not pull in a JSON library for one file.
// Strict enough for that file: objects, arrays, strings with escapes,
// numbers, true/false/null; anything else throws std::runtime_error.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace zrl_test {

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool is_null() const { return type == Type::kNull; }
  const Json& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (type != Type::kObject || it == object.end()) throw std::runtime_error("json: no key '" + key + "'");
    return it->second;
  }
  const Json& operator[](std::size_t i) const { return array.at(i); }

  static Json parse(std::string_view text) {
    std::size_t pos = 0;
    Json j = parse_value(text, &pos);
    skip_ws(text, &pos);
    if (pos != text.size()) throw std::runtime_error("json: trailing data");
    return j;
  }

 private:
  static void skip_ws(std::string_view t, std::size_t* p) {
    while (*p < t.size() && (t[*p] == ' ' || t[*p] == '\n' || t[*p] == '\r' || t[*p] == '\t')) ++*p;
  }

  static void expect(std::string_view t, std::size_t* p, std::string_view word) {
    if (t.substr(*p, word.size()) != word) throw std::runtime_error("json: expected " + std::string(word));
    *p += word.size();
  }

  static void append_utf8(std::string* out, unsigned cp) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  static unsigned hex4(std::string_view t, std::size_t* p) {
    if (*p + 4 > t.size()) throw std::runtime_error("json: short \\u escape");
    const unsigned v = static_cast<unsigned>(std::stoul(std::string(t.substr(*p, 4)), nullptr, 16));
    *p += 4;
    return v;
  }

  static std::string parse_string(std::string_view t, std::size_t* p) {
    expect(t, p, "\"");
    std::string s;
    while (*p < t.size() && t[*p] != '"') {
      char c = t[(*p)++];
      if (c != '\\') {
        s += c;
        continue;
      }
      if (*p >= t.size()) break;
      c = t[(*p)++];
      switch (c) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        case 'u': {
          unsigned cp = hex4(t, p);
          if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
            expect(t, p, "\\u");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(t, p) - 0xDC00);
          }
          append_utf8(&s, cp);
          break;
        }
        default:
          throw std::runtime_error("json: bad escape");
      }
    }
    expect(t, p, "\"");
    return s;
  }

  static Json parse_value(std::string_view t, std::size_t* p) {
    skip_ws(t, p);
    if (*p >= t.size()) throw std::runtime_error("json: unexpected end");
    Json j;
    const char c = t[*p];
    if (c == '{') {
      j.type = Type::kObject;
      ++*p;
      skip_ws(t, p);
      if (t[*p] == '}') {
        ++*p;
        return j;
      }
      for (;;) {
        skip_ws(t, p);
        std::string key = parse_string(t, p);
        skip_ws(t, p);
        expect(t, p, ":");
        j.object[key] = parse_value(t, p);
        skip_ws(t, p);
        if (t[*p] == ',') {
          ++*p;
          continue;
        }
        expect(t, p, "}");
        return j;
      }
    }
    if (c == '[') {
      j.type = Type::kArray;
      ++*p;
      skip_ws(t, p);
      if (t[*p] == ']') {
        ++*p;
        return j;
      }
      for (;;) {
        j.array.push_back(parse_value(t, p));
        skip_ws(t, p);
        if (t[*p] == ',') {
          ++*p;
          continue;
        }
        expect(t, p, "]");
        return j;
      }
    }
    if (c == '"') {
      j.type = Type::kString;
      j.string = parse_string(t, p);
      return j;
    }
    if (t.substr(*p, 4) == "true") {
      j.type = Type::kBool;
      j.boolean = true;
      *p += 4;
      return j;
    }
    if (t.substr(*p, 5) == "false") {
      j.type = Type::kBool;
      *p += 5;
      return j;
    }
    if (t.substr(*p, 4) == "null") {
      *p += 4;
      return j;
    }
    const std::string rest(t.substr(*p, 64));
    char* end = nullptr;
    j.number = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) throw std::runtime_error("json: unexpected character");
    j.type = Type::kNumber;
    *p += static_cast<std::size_t>(end - rest.c_str());
    return j;
  }
};

}  // namespace zrl_test
