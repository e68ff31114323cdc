#include "server/session.h"

#include <fmt/format.h>

namespace dsaserve::server {

Session::Session(tcp::socket socket, const Router& router, int64_t max_body_bytes, double read_timeout_s)
    : stream_(std::move(socket)),
      router_(router),
      max_body_bytes_(max_body_bytes),
      read_timeout_s_(read_timeout_s) {}

void Session::start() {
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); });
}

void Session::read() {
  if (closed_) return;
  parser_.emplace();
  parser_->body_limit(uint64_t(max_body_bytes_));
  stream_.expires_after(std::chrono::milliseconds(int64_t(read_timeout_s_ * 1000)));
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void Session::on_read(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    keep_alive_ = false;
    send_json(413, ApiError(413, fmt::format("the request body exceeds {} bytes", max_body_bytes_)).body());
    return;
  }
  if (ec) return close();  // end of stream, timeout, reset
  stream_.expires_never();
  req_ = parser_->release();
  keep_alive_ = req_.keep_alive();
  respond_done_ = false;
  router_(shared_from_this(), req_);
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
    }
    // EOF or error: the client is gone.
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
  queue_write(head + body);
}

void Session::send_json(int status, const nlohmann::json& body) {
  send(status, body.dump(), "application/json");
}

void Session::stream_begin() {
  queue_write(
      "HTTP/1.1 200 OK\r\nServer: dsaserve\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "Transfer-Encoding: chunked\r\nConnection: " +
      std::string(keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n");
}

void Session::stream_event(const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  queue_write(fmt::format("{:x}\r\n", ev.size()) + ev + "\r\n");
}

void Session::stream_end() {
  respond_done_ = true;
  queue_write("0\r\n\r\n");
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
    writing_ = false;
    if (respond_done_) after_response();
    return;
  }
  writing_ = true;
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

void Session::after_response() {
  respond_done_ = false;
  if (job_ && !job_->finished()) return;  // still generating (cannot happen: responses end jobs)
  if (!keep_alive_) return close();
  read();
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
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
