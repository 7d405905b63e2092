// Text -> byte tokens, the text-file converter, and the built-in generated corpus.
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <fstream>
#include <string>

#include "base/text.hpp"
#include "io/splitmix64.hpp"
#include "io/token_storage.hpp"
#include "zerotrain/data.hpp"
#include "zerotrain/error.hpp"

namespace zt {

std::vector<std::uint32_t> tokenize_bytes(std::string_view text) {
  std::vector<std::uint32_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

ConvertStats convert_text_file(const std::filesystem::path& input, const std::filesystem::path& output) {
  io::refuse_output_onto_input(input, output, "text");
  struct stat input_info {};
  if (::stat(input.c_str(), &input_info) == 0 && S_ISDIR(input_info.st_mode))
    ZT_THROW_AS(IoError, "input '", input.string(), "' is a directory; expected a text file");
  std::ifstream in(input, std::ios::binary);
  if (!in)
    ZT_THROW_AS(IoError, "cannot open text file '", input.string(),
                "' for reading: ", base::errno_text(errno));
  TokenFileWriter writer(output, kByteVocabSize, 2);
  ConvertStats stats;
  std::string chunk(1 << 20, '\0');
  // Streamed in 1 MiB pieces, so inputs larger than memory convert too.
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (got == 0) break;
    writer.append(tokenize_bytes(std::string_view(chunk.data(), got)));
    stats.input_bytes += got;
  }
  if (in.bad())
    ZT_THROW_AS(IoError, "reading text file '", input.string(), "' failed after ", stats.input_bytes,
                " bytes");
  stats.tokens = writer.commit().token_count;
  return stats;
}

// ---- built-in corpus ---------------------------------------------------------------------------

namespace {

// Generates the built-in corpus. Structure a small model can learn, from easy to harder:
// spelling and spacing of a few hundred words; sentence templates; names that recur within a
// story; counting and calendar sequences; arithmetic facts whose answers follow from the question;
// stories whose later sentences are implied by earlier ones (has 3, is given 4, now has 7).
class CorpusGenerator {
 public:
  explicit CorpusGenerator(std::uint64_t seed) : rng_(seed) {}

  std::string generate(std::size_t target_bytes) {
    text_.reserve(target_bytes + 1024);
    while (text_.size() < target_bytes) {
      switch (rng_.below(6)) {
        case 0:
        case 1:
          story();
          break;
        case 2:
          arithmetic();
          break;
        case 3:
          counting();
          break;
        case 4:
          calendar();
          break;
        default:
          facts();
          break;
      }
    }
    return std::move(text_);
  }

 private:
  template <std::size_t N>
  std::string_view pick(const std::array<std::string_view, N>& words) {
    return words[rng_.below(N)];
  }
  std::uint64_t between(std::uint64_t low, std::uint64_t high) { return low + rng_.below(high - low + 1); }

  // Appends a sentence: first letter capitalized, then ". " (or the given end).
  void sentence(std::string body, std::string_view end = ". ") {
    if (!body.empty() && body[0] >= 'a' && body[0] <= 'z') body[0] = static_cast<char>(body[0] - 'a' + 'A');
    text_ += body;
    text_ += end;
  }
  void end_paragraph() {
    if (!text_.empty() && text_.back() == ' ') text_.pop_back();
    text_ += '\n';
  }

  static std::string plural(std::string_view noun, std::uint64_t n) {
    std::string word(noun);
    if (n != 1) word += noun.back() == 'h' || noun.back() == 's' || noun.back() == 'x' ? "es" : "s";
    return word;
  }
  static std::string count_of(std::uint64_t n, std::string_view noun) {
    return std::to_string(n) + " " + plural(noun, n);
  }

  static constexpr std::array<std::string_view, 16> kNames = {
      "Alice", "Bob",  "Carol", "Dave", "Emma", "Frank", "Grace",  "Henry",
      "Ivy",   "Jack", "Kate",  "Liam", "Mia",  "Noah",  "Olivia", "Peter"};
  static constexpr std::array<std::string_view, 10> kPlaces = {
      "park", "market", "river", "school", "garden", "library", "beach", "forest", "farm", "station"};
  static constexpr std::array<std::string_view, 10> kObjects = {"apple", "book", "coin", "pencil", "orange",
                                                                "ball",  "box",  "cup",  "shell",  "stone"};
  static constexpr std::array<std::string_view, 10> kAnimals = {"cat", "dog",   "fox",  "bird", "horse",
                                                                "cow", "sheep", "duck", "frog", "mouse"};
  static constexpr std::array<std::string_view, 10> kAdjectives = {
      "small", "big", "red", "quiet", "happy", "old", "young", "brown", "quick", "lazy"};
  static constexpr std::array<std::string_view, 8> kVerbs = {"runs", "walks", "jumps", "sleeps",
                                                             "sits", "plays", "waits", "looks"};
  static constexpr std::array<std::string_view, 6> kPrepositions = {"near", "by",    "behind",
                                                                    "in",   "under", "past"};
  static constexpr std::array<std::string_view, 8> kFoods = {"bread", "soup",  "rice",  "cheese",
                                                             "fish",  "honey", "pasta", "cake"};
  static constexpr std::array<std::string_view, 6> kWeather = {"sunny", "cold",  "warm",
                                                               "rainy", "windy", "bright"};
  static constexpr std::array<std::string_view, 7> kDays = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                                            "Friday", "Saturday", "Sunday"};
  static constexpr std::array<std::string_view, 12> kMonths = {
      "January", "February", "March",     "April",   "May",      "June",
      "July",    "August",   "September", "October", "November", "December"};
  static constexpr std::array<std::string_view, 21> kNumberWords = {
      "zero",     "one",     "two",     "three",     "four",     "five",     "six",
      "seven",    "eight",   "nine",    "ten",       "eleven",   "twelve",   "thirteen",
      "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"};
  static constexpr std::array<std::string_view, 12> kOrdinals = {"first", "second", "third",    "fourth",
                                                                 "fifth", "sixth",  "seventh",  "eighth",
                                                                 "ninth", "tenth",  "eleventh", "twelfth"};

  void story() {
    const std::string_view a = pick(kNames);
    std::string_view b = pick(kNames);
    while (b == a) b = pick(kNames);
    const std::string_view place = pick(kPlaces);
    const std::string_view object = pick(kObjects);
    sentence("it was a " + std::string(pick(kWeather)) + " " + std::string(pick(kDays)) + " in " +
             std::string(pick(kMonths)));
    sentence(std::string(a) + " went to the " + std::string(place) + " with " + std::string(b));
    std::uint64_t held = between(1, 9);
    sentence(std::string(a) + " had " + count_of(held, object));
    const std::uint64_t events = between(1, 3);
    for (std::uint64_t e = 0; e < events; ++e) {
      if (rng_.below(3) != 0 || held < 2) {
        const std::uint64_t given = between(1, 9);
        sentence(std::string(b) + " gave " + std::string(a) + " " + count_of(given, object));
        held += given;
      } else {
        const std::uint64_t lost = between(1, held - 1);
        sentence(std::string(a) + " lost " + count_of(lost, object) + " at the " + std::string(place));
        held -= lost;
      }
      sentence("now " + std::string(a) + " has " + count_of(held, object));
    }
    const std::string_view adjective = pick(kAdjectives);
    const std::string_view animal = pick(kAnimals);
    sentence("the " + std::string(adjective) + " " + std::string(animal) + " " + std::string(pick(kVerbs)) +
             " " + std::string(pick(kPrepositions)) + " the " + std::string(place));
    sentence(std::string(a) + " saw the " + std::string(adjective) + " " + std::string(animal) + " and " +
             std::string(b) + " saw it too");
    const std::string_view food = pick(kFoods);
    std::string_view other_food = pick(kFoods);
    while (other_food == food) other_food = pick(kFoods);
    sentence(std::string(a) + " likes " + std::string(food) + " but " + std::string(b) + " likes " +
             std::string(other_food));
    if (rng_.below(2) == 0) {
      sentence("how many " + plural(object, 2) + " does " + std::string(a) + " have", "? ");
      sentence(std::string(a) + " has " + count_of(held, object));
    }
    sentence("then " + std::string(a) + " and " + std::string(b) + " went home");
    end_paragraph();
  }

  void arithmetic() {
    const std::uint64_t facts = between(3, 8);
    for (std::uint64_t i = 0; i < facts; ++i) {
      const std::uint64_t x = between(0, 12);
      const std::uint64_t y = between(0, 12);
      switch (rng_.below(3)) {
        case 0:
          sentence(std::to_string(x) + " plus " + std::to_string(y) + " is " + std::to_string(x + y));
          break;
        case 1:
          if (x >= y)
            sentence(std::to_string(x) + " minus " + std::to_string(y) + " is " + std::to_string(x - y));
          else
            sentence(std::to_string(y) + " minus " + std::to_string(x) + " is " + std::to_string(y - x));
          break;
        default:
          sentence(std::to_string(x) + " times " + std::to_string(y) + " is " + std::to_string(x * y));
          break;
      }
    }
    end_paragraph();
  }

  void counting() {
    const std::uint64_t start = between(0, 12);
    const std::uint64_t length = between(4, 20 - start);
    std::string body = "count with me: ";
    for (std::uint64_t i = start; i < start + length && i < kNumberWords.size(); ++i) {
      if (i != start) body += ", ";
      body += kNumberWords[i];
    }
    sentence(body);
    const std::uint64_t n = between(0, 20);
    sentence(std::string(kNumberWords[n]) + " is written " + std::to_string(n));
    end_paragraph();
  }

  void calendar() {
    const std::uint64_t day = rng_.below(kDays.size());
    sentence("after " + std::string(kDays[day]) + " comes " + std::string(kDays[(day + 1) % kDays.size()]));
    sentence("before " + std::string(kDays[day]) + " comes " +
             std::string(kDays[(day + kDays.size() - 1) % kDays.size()]));
    const std::uint64_t month = rng_.below(kMonths.size());
    sentence(std::string(kMonths[month]) + " is the " + std::string(kOrdinals[month]) + " month of the year");
    sentence("after " + std::string(kMonths[month]) + " comes " +
             std::string(kMonths[(month + 1) % kMonths.size()]));
    sentence("a week has seven days and a year has twelve months");
    end_paragraph();
  }

  void facts() {
    struct Fact {
      std::string_view question, answer;
    };
    static constexpr std::array<Fact, 12> kFacts = {{
        {"what color is the sky", "the sky is blue"},
        {"what color is the grass", "the grass is green"},
        {"what does the cow say", "the cow says moo"},
        {"what does the dog say", "the dog says woof"},
        {"what does the cat say", "the cat says meow"},
        {"what does the duck say", "the duck says quack"},
        {"what color is snow", "snow is white"},
        {"where do fish live", "fish live in the water"},
        {"what do birds do", "birds fly in the sky"},
        {"how many legs does a dog have", "a dog has four legs"},
        {"how many legs does a bird have", "a bird has two legs"},
        {"what comes after night", "day comes after night"},
    }};
    const std::uint64_t count = between(2, 5);
    for (std::uint64_t i = 0; i < count; ++i) {
      const Fact& fact = kFacts[rng_.below(kFacts.size())];
      sentence("q: " + std::string(fact.question), "? ");
      sentence("a: " + std::string(fact.answer));
    }
    end_paragraph();
  }

  detail::SplitMix64 rng_;
  std::string text_;
};

// Fixed: changing either changes the corpus, which tests and recorded losses depend on.
constexpr std::uint64_t kCorpusSeed = 0x5A45524F54524149ULL;  // "ZEROTRAI"
constexpr std::size_t kCorpusBytes = 1'500'000;

}  // namespace

const std::string& builtin_corpus_text() {
  static const std::string text = CorpusGenerator(kCorpusSeed).generate(kCorpusBytes);
  return text;
}

const std::vector<std::uint32_t>& builtin_corpus_tokens() {
  static const std::vector<std::uint32_t> tokens = tokenize_bytes(builtin_corpus_text());
  return tokens;
}

TokenView builtin_corpus_view() {
  return TokenView(builtin_corpus_tokens(), kByteVocabSize, "builtin corpus");
}

}  // namespace zt
