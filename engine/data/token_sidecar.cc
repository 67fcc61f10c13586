// The sidecar of a token file (read_token_sidecar) and the tokenizer fingerprint of a model
// folder, as scripts/tokenize-text.py writes and computes them.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/data/data.h"
#include "serialization/serialization_error.h"
#include "serialization/sha256.h"

namespace zinf::data {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int width_of(const std::string& path) {
  if (ends_with(path, ".u16") || ends_with(path, ".bin16")) return 2;
  if (ends_with(path, ".u32") || ends_with(path, ".bin32")) return 4;
  return 0;
}

}  // namespace

bool is_token_file(const std::string& path) noexcept { return width_of(path) != 0; }

std::optional<TokenSidecar> read_token_sidecar(const std::string& data_path,
                                               const TokenSource& source) {
  const int width = width_of(data_path);
  const std::string path = data_path + ".json";
  if (width == 0 || !fs::exists(path)) return std::nullopt;
  auto fail = [&](const std::string& key, const std::string& what) -> DataError {
    return DataError(fmt::format("{}: \"{}\" {}", path, key, what));
  };
  nlohmann::json j;
  {
    std::ifstream in(path);
    if (!in) throw DataError(fmt::format("{}: cannot be read", path));
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: not valid JSON: {}", path, e.what()));
    }
  }
  if (!j.is_object()) throw DataError(fmt::format("{}: not a JSON object", path));
  if (j.value("format", std::string()) != "zinf-tokens/1") {
    throw fail("format", fmt::format("is {}, not \"zinf-tokens/1\" (the sidecar "
                                     "scripts/tokenize-text.py writes)",
                                     j.contains("format") ? j["format"].dump() : "missing"));
  }
  auto count = [&](const nlohmann::json& parent, const std::string& key, bool required,
                   const std::string& name) -> std::optional<uint64_t> {
    const auto it = parent.find(key);
    if (it == parent.end() || it->is_null()) {
      if (required) throw fail(name, "is missing");
      return std::nullopt;
    }
    if (!it->is_number_unsigned()) {
      throw fail(name, fmt::format("must be a non-negative integer, not {}", it->dump()));
    }
    return it->get<uint64_t>();
  };
  TokenSidecar s;
  s.path = path;
  s.tokens = *count(j, "tokens", true, "tokens");
  s.width = static_cast<int>(*count(j, "width", true, "width"));
  s.documents = count(j, "documents", false, "documents").value_or(0);
  s.vocab_size = *count(j, "vocab_size", true, "vocab_size");
  s.eos_id = count(j, "eos_id", false, "eos_id");
  s.bos_id = count(j, "bos_id", false, "bos_id");
  const auto tok = j.find("tokenizer");
  if (tok == j.end() || !tok->is_object()) throw fail("tokenizer", "must be an object");
  s.tokenizer_class = tok->value("class", std::string());
  s.tokenizer_source = tok->value("source", std::string());
  s.tokenizer_sha256 = tok->value("sha256", std::string());
  if (const auto files = tok->find("files"); files != tok->end() && files->is_object()) {
    for (const auto& [name, hash] : files->items()) {
      if (hash.is_string()) s.tokenizer_files[name] = hash.get<std::string>();
    }
  }
  // It must describe this file: a sidecar copied beside another file would vouch for ids it
  // never saw.
  if (s.width != width) {
    throw fail("width", fmt::format("is {} bytes but {} holds {}-byte ids (its name says so)",
                                    s.width, data_path, width));
  }
  if (s.tokens != source.size()) {
    throw fail("tokens", fmt::format("is {} but {} holds {}: the sidecar was written for "
                                     "another file",
                                     s.tokens, data_path, source.size()));
  }
  if (s.eos_id && *s.eos_id >= s.vocab_size) {
    throw fail("eos_id", fmt::format("is {}, not below vocab_size {}", *s.eos_id, s.vocab_size));
  }
  return s;
}

std::string tokenizer_fingerprint(const std::string& folder) {
  std::string listing;
  for (const char* name : kTokenizerFiles) {  // already in name order
    const fs::path file = fs::path(folder) / name;
    if (!fs::is_regular_file(file)) continue;
    try {
      listing += fmt::format("{}{}{}\n", name, '\0', serialization::sha256_file_hex(file.string()));
    } catch (const serialization::SerializationError& e) {
      throw DataError(e.what());
    }
  }
  if (listing.empty()) return {};
  return serialization::sha256_hex(
      {reinterpret_cast<const uint8_t*>(listing.data()), listing.size()});
}

}  // namespace zinf::data
