#include "server/session.h"

#include <fmt/format.h>

#include "server/json_body.h"

namespace dsaserve::server {

Session::Session(tcp::socket socket, const Router& router, int64_t max_body_bytes, double read_timeout_s,
                 int64_t* writes_in_flight)
    : stream_(std::move(socket)),
      router_(router),
      max_body_bytes_(max_body_bytes),
      read_timeout_s_(read_timeout_s),
      writes_in_flight_(writes_in_flight) {}

namespace {

// The first coding of a Content-Encoding / Transfer-Encoding list other than identity (and chunked, for a
// transfer coding, which the parser has undone), or "" when there is none.
std::string unsupported_coding(beast::string_view list, bool transfer) {
  std::string_view rest(list.data(), list.size());
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    const beast::string_view b(item.data(), item.size());
    if (item.empty() || beast::iequals(b, "identity") || (transfer && beast::iequals(b, "chunked"))) continue;
    return printable(item);
  }
  return "";
}

}  // namespace

void Session::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
}

void Session::read() {
  if (closed_) return;
  parser_.emplace();
  parser_->header_limit(kMaxHeaderBytes);
  parser_->body_limit(uint64_t(max_body_bytes_));
  stream_.expires_after(std::chrono::milliseconds(int64_t(read_timeout_s_ * 1000)));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void Session::on_read(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    return reject(413, fmt::format("the request body exceeds {} bytes", max_body_bytes_));
  }
  if (ec == http::error::header_limit) {
    return reject(431, fmt::format("the request line and header fields exceed {} bytes", kMaxHeaderBytes));
  }
  // A request that does not parse (a clean close before a request, or in the middle of one, is not one).
  if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return reject(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }
  if (ec) return close();  // end of stream, timeout, reset
  stream_.expires_never();
  req_ = parser_->release();
  keep_alive_ = req_.keep_alive();
  http10_ = req_.version() < 11;
  respond_done_ = false;
  response_started_ = false;
  // Codings the body would need undoing: served as-is they would be read as JSON (RFC 9110: 415 for a
  // Content-Encoding the server does not take; RFC 9112: 501 for a transfer coding it does not know).
  if (const std::string c = unsupported_coding(req_[http::field::content_encoding], false); !c.empty()) {
    return reject(415, fmt::format("Content-Encoding '{}' is not supported: send the body uncompressed", c));
  }
  if (const std::string c = unsupported_coding(req_[http::field::transfer_encoding], true); !c.empty()) {
    return reject(501, fmt::format("Transfer-Encoding '{}' is not implemented (chunked is)", c));
  }
  try {
    router_(shared_from_this(), req_);
  } catch (...) {
    // The router answers its own errors; this is the last line, so that nothing a client sends ends the
    // process.
    if (!respond_done_) {
      keep_alive_ = false;
      send(500, R"({"error":{"message":"internal error","type":"server_error","param":null,"code":null}})",
           "application/json");
    }
  }
}

void Session::reject(int status, const std::string& message) {
  keep_alive_ = false;
  linger_ = true;
  respond_done_ = false;
  send_json(status, ApiError(status, printable(message)).body());
}

void Session::set_job(std::shared_ptr<Job> job) {
  job_ = std::move(job);
  watch_disconnect();
}

void Session::watch_disconnect() {
  stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
    if (!self->job_ || self->closed_) return;
    if (!ec) {
      char c;
      beast::error_code pe;
      const size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek, pe);
      if (n > 0 && !pe) return;  // a pipelined request: not a disconnect
      if (pe == net::error::eof) {
        // End of stream: the client shut down its sending side (it may still wait for the answer) or closed
        // the connection (it is gone). A stream's next event tells them apart (its write fails); before
        // any of the response, an HTTP/1.1 client is sent an interim 100 (Continue), which every HTTP/1.1
        // client parses and skips (RFC 9110 15.2): a closed connection answers it with a reset, which
        // cancels the generation (a queued one too); a half-closed client reads it and gets its answer.
        self->peer_eof_ = true;
        self->keep_alive_ = false;
        if (!self->http10_ && !self->response_started_) {
          self->queue_write("HTTP/1.1 100 Continue\r\n\r\n");
          self->watch_reset();
        }
        return;
      }
    }
    // A reset or another error: the client is gone.
    auto job = self->job_;
    job->cancel();
    self->close();
  });
}

void Session::watch_reset() {
  stream_.socket().async_wait(tcp::socket::wait_error, [self = shared_from_this()](beast::error_code ec) {
    if (!self->job_ || self->closed_ || ec == net::error::operation_aborted) return;
    // An error (a reset: the client had closed the connection) or a hang-up on the socket.
    auto job = self->job_;
    job->cancel();
    self->close();
  });
}

void Session::send(int status, std::string body, const std::string& content_type) {
  std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nServer: dsaserve\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: "
      "{}\r\n\r\n",
      status, std::string(http::obsolete_reason(http::status(status))), content_type, body.size(),
      keep_alive_ ? "keep-alive" : "close");
  respond_done_ = true;
  response_started_ = true;
  queue_write(head + body);
}

void Session::send_json(int status, const nlohmann::json& body) {
  send(status, dump_json(body), "application/json");
}

void Session::stream_begin() {
  response_started_ = true;
  if (http10_) {
    // No chunked encoding in HTTP/1.0: the end of the connection ends the stream.
    keep_alive_ = false;
    queue_write(
        "HTTP/1.1 200 OK\r\nServer: dsaserve\r\nContent-Type: text/event-stream\r\nCache-Control: "
        "no-cache\r\nConnection: close\r\n\r\n");
    return;
  }
  queue_write(
      "HTTP/1.1 200 OK\r\nServer: dsaserve\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "Transfer-Encoding: chunked\r\nConnection: " +
      std::string(keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n");
}

void Session::stream_event(const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  if (http10_) return queue_write(ev);
  queue_write(fmt::format("{:x}\r\n", ev.size()) + ev + "\r\n");
}

void Session::stream_end() {
  respond_done_ = true;
  if (!http10_) return queue_write("0\r\n\r\n");
  if (!writing_ && !closed_) after_response();
}

void Session::job_done() { job_.reset(); }

void Session::queue_write(std::string data) {
  if (closed_) return;
  out_.push_back(std::move(data));
  if (!writing_) write_next();
}

void Session::write_next() {
  if (closed_) return;
  if (out_.empty()) {
    set_writing(false);
    if (respond_done_) after_response();
    return;
  }
  set_writing(true);
  net::async_write(stream_, net::buffer(out_.front()),
                   [self = shared_from_this()](beast::error_code ec, size_t) {
                     if (ec) {
                       if (auto job = self->job_) job->cancel();
                       return self->close();
                     }
                     self->out_.pop_front();
                     self->write_next();
                   });
}

void Session::set_writing(bool writing) {
  if (writing == writing_) return;
  writing_ = writing;
  if (writes_in_flight_ != nullptr) *writes_in_flight_ += writing ? 1 : -1;
}

void Session::after_response() {
  respond_done_ = false;
  if (job_ && !job_->finished()) return;  // still generating (cannot happen: responses end jobs)
  if (!keep_alive_) return linger_ ? linger_close() : close();
  read();
}

void Session::linger_close() {
  if (closed_) return;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.expires_after(std::chrono::seconds(2));
  drain_buf_.resize(4096);
  drain_input();
}

void Session::drain_input() {
  stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->close();  // end of stream, reset or the 2 s are up
    self->drain_input();
  });
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  set_writing(false);
  if (job_) {
    auto job = job_;
    job_.reset();
    job->cancel();
  }
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.socket().close(ec);
}

}  // namespace dsaserve::server
