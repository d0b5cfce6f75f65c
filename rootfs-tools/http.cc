#include "rootfs-tools/http.h"

#include <curl/curl.h>

#include <exception>
#include <mutex>

namespace berth::images {

namespace {

struct CurlFree {
    void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistFree {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Slist = std::unique_ptr<curl_slist, SlistFree>;

void global_init() {
    // curl_global_init is not safe to race with other curl calls: once, before any handle.
    static std::once_flag once;
    std::call_once(once, [] {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            throw std::runtime_error("curl_global_init failed");
    });
}

std::string lower(std::string s) {
    for (char& c : s) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    return s;
}

std::string trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() &&
           (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
        s.remove_suffix(1);
    return std::string(s);
}

// What one transfer's callbacks share.
struct Transfer {
    const HttpSink* sink = nullptr;
    size_t body_limit = 0;
    const std::function<bool()>* cancelled = nullptr;
    HttpResponse response;
    bool began = false;       // sink->begin called for the current answer
    bool over_limit = false;  // a kept body passed its limit
    bool was_cancelled = false;
    std::exception_ptr error;  // what the sink threw

    bool streaming() const { return sink && (response.status == 200 || response.status == 206); }
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const std::string_view line(data, size * n);
    if (line.rfind("HTTP/", 0) == 0) {
        // A new answer (after a redirect, or the first): only the last one counts.
        t->response.headers.clear();
        t->response.body.clear();
        t->began = false;
        const size_t sp = line.find(' ');
        t->response.status = sp == std::string_view::npos ? 0 : std::atol(line.data() + sp + 1);
        return size * n;
    }
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos)
        t->response.headers.emplace(lower(trim(line.substr(0, colon))),
                                    trim(line.substr(colon + 1)));
    return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    const size_t len = size * n;
    if (t->cancelled && *t->cancelled && (*t->cancelled)()) {
        t->was_cancelled = true;
        return 0;  // ends the transfer
    }
    if (t->streaming()) {
        try {
            if (!t->began) {
                t->began = true;
                if (t->sink->begin) t->sink->begin(t->response);
            }
            t->sink->data(std::string_view(data, len));
        } catch (...) {
            t->error = std::current_exception();
            return 0;
        }
        return len;
    }
    if (t->response.body.size() + len > t->body_limit) {
        t->over_limit = true;
        return 0;
    }
    t->response.body.append(data, len);
    return len;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    auto* t = static_cast<Transfer*>(user);
    if (t->cancelled && *t->cancelled && (*t->cancelled)()) {
        t->was_cancelled = true;
        return 1;
    }
    return 0;
}

}  // namespace

struct HttpClient::Impl {
    HttpTimeouts timeouts;
    std::function<bool()> cancelled;
    std::unique_ptr<CURL, CurlFree> curl;
    char errbuf[CURL_ERROR_SIZE] = {};
};

HttpClient::HttpClient(HttpTimeouts timeouts, std::function<bool()> cancelled)
    : impl_(std::make_unique<Impl>()) {
    global_init();
    impl_->timeouts = timeouts;
    impl_->cancelled = std::move(cancelled);
    impl_->curl.reset(curl_easy_init());
    if (!impl_->curl) throw std::runtime_error("curl_easy_init failed");
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::get(const HttpRequest& req, const HttpSink* sink, size_t body_limit) {
    CURL* c = impl_->curl.get();
    // The handle keeps its connection cache across requests; only the options start afresh.
    curl_easy_reset(c);
    Transfer t;
    t.sink = sink;
    t.body_limit = body_limit;
    t.cancelled = &impl_->cancelled;
    impl_->errbuf[0] = '\0';

    Slist headers;
    for (const auto& h : req.headers) {
        curl_slist* next = curl_slist_append(headers.get(), h.c_str());
        if (!next) throw std::bad_alloc();
        headers.release();
        headers.reset(next);
    }
    const std::string range = req.range_from ? std::to_string(*req.range_from) + "-" : "";
    const std::string agent = std::string("berth/") + BERTH_VERSION;
    curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    // Registries send blob downloads to storage (S3, a CDN) by redirect.
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 8L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, impl_->errbuf);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, long(impl_->timeouts.connect.count()));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, long(impl_->timeouts.low_speed_bytes));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, long(impl_->timeouts.low_speed_time.count()));
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, req.verify_tls ? 1L : 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, req.verify_tls ? 2L : 0L);
    if (!range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
    if (req.basic) {
        // Given to the host asked, not to one a redirect leads to (CURLOPT_UNRESTRICTED_AUTH
        // stays off): a blob's storage must not see the registry password.
        curl_easy_setopt(c, CURLOPT_HTTPAUTH, long(CURLAUTH_BASIC));
        curl_easy_setopt(c, CURLOPT_USERNAME, req.basic->username.c_str());
        curl_easy_setopt(c, CURLOPT_PASSWORD, req.basic->password.c_str());
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);

    const CURLcode rc = curl_easy_perform(c);
    char* effective = nullptr;
    if (curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &effective) == CURLE_OK && effective)
        t.response.url = effective;
    if (t.error) std::rethrow_exception(t.error);
    if (t.was_cancelled) throw HttpCancelled("GET " + req.url + ": cancelled");
    if (rc == CURLE_OK) {
        // A 2xx answer with an empty body never called the sink: tell it it began.
        if (t.streaming() && !t.began && sink->begin) sink->begin(t.response);
        return std::move(t.response);
    }
    if (t.over_limit) {
        throw HttpTransportError("GET " + req.url + ": the answer (HTTP " +
                                     std::to_string(t.response.status) + ") is over " +
                                     std::to_string(body_limit) + " bytes",
                                 false);
    }
    std::string why = impl_->errbuf[0] ? impl_->errbuf : curl_easy_strerror(rc);
    const bool no_connection = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                               rc == CURLE_COULDNT_RESOLVE_PROXY;
    throw HttpTransportError("GET " + req.url + ": " + why, no_connection);
}

std::string url_escape(std::string_view s) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~') {
            out += char(c);
        } else {
            out += '%';
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

}  // namespace berth::images
