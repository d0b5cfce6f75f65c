#include "rootfs-tools/auth_challenge.h"

#include <stdexcept>

namespace berth::images {

namespace {

// RFC 7230 tchar, plus the base64 characters a token68 may hold.
bool token_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~/").find(c) != std::string_view::npos;
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    return out;
}

class Parser {
  public:
    explicit Parser(std::string_view text) : text_(text) {}

    std::vector<AuthChallenge> run() {
        std::vector<AuthChallenge> out;
        skip_separators();
        while (!done()) {
            AuthChallenge c;
            c.scheme = lower(token("an authentication scheme"));
            skip_spaces();
            // Parameters until the next challenge: a token followed by a space or the end
            // (a scheme) rather than by "=".
            while (!done()) {
                skip_separators();
                if (done()) break;
                const size_t mark = pos_;
                std::string name = token("a parameter name");
                skip_spaces();
                if (done() || peek() != '=') {  // the next challenge's scheme
                    pos_ = mark;
                    break;
                }
                ++pos_;
                skip_spaces();
                std::string value = !done() && peek() == '"' ? quoted() : bare_value();
                c.params[lower(name)] = std::move(value);
                skip_spaces();
                if (!done() && peek() != ',') fail("expected ',' between parameters");
            }
            out.push_back(std::move(c));
            skip_separators();
        }
        if (out.empty()) fail("no challenge");
        return out;
    }

  private:
    bool done() const { return pos_ >= text_.size(); }
    char peek() const { return text_[pos_]; }
    void skip_spaces() {
        while (!done() && (peek() == ' ' || peek() == '\t')) ++pos_;
    }
    void skip_separators() {
        while (!done() && (peek() == ' ' || peek() == '\t' || peek() == ',')) ++pos_;
    }
    std::string token(const char* what) {
        const size_t start = pos_;
        while (!done() && token_char(peek())) ++pos_;
        if (pos_ == start) fail(std::string("expected ") + what);
        return std::string(text_.substr(start, pos_ - start));
    }
    // An unquoted value. Strictly a token, but registries have been seen to send URLs
    // unquoted: anything up to the next separator.
    std::string bare_value() {
        const size_t start = pos_;
        while (!done() && peek() != ',' && peek() != ' ' && peek() != '\t' && peek() != '"') ++pos_;
        if (pos_ == start) fail("expected a value");
        return std::string(text_.substr(start, pos_ - start));
    }
    std::string quoted() {
        ++pos_;  // the opening quote
        std::string out;
        while (!done() && peek() != '"') {
            if (peek() == '\\' && pos_ + 1 < text_.size()) ++pos_;
            out += text_[pos_++];
        }
        if (done()) fail("unterminated quoted string");
        ++pos_;
        return out;
    }
    [[noreturn]] void fail(const std::string& why) const {
        throw std::invalid_argument("malformed WWW-Authenticate header '" +
                                    std::string(text_.substr(0, 300)) + "': " + why +
                                    " at offset " + std::to_string(pos_));
    }

    std::string_view text_;
    size_t pos_ = 0;
};

}  // namespace

std::vector<AuthChallenge> parse_www_authenticate(std::string_view header) {
    return Parser(header).run();
}

}  // namespace berth::images
