// The HTTP server in-process on 127.0.0.1 (ephemeral port), driven with httplib::Client. Oracle
// for generated text: runtime::generate on a second instance of the same model.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "server/server.h"
#include "server_test_util.h"

namespace perry::server {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int64_t kCtx = 512;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    served_ = new test_util::LoadedTiny(test_util::load_tiny());
    oracle_ = new test_util::LoadedTiny(test_util::load_tiny());
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_dir = test_util::model_dir();
    o.model_name = "perry-test";
    o.n_parallel = 4;
    o.ctx = kCtx;
    o.max_body_bytes = 64 << 10;
    server_ = new Server(*served_->model, *served_->tok, o);
    server_->bind();
    thread_ = new std::thread([] { server_->run(); });
    httplib::Client c("127.0.0.1", server_->port());
    for (int i = 0; i < 500; ++i) {
      if (auto r = c.Get("/health"); r && r->status == 200) return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL() << "server did not come up";
  }
  static void TearDownTestSuite() {
    server_->stop(1000ms);
    thread_->join();
    delete thread_;
    delete server_;
    delete oracle_;
    delete served_;
  }

  httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int expect_status = 200) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << "no response from " << path;
    if (!r) return json();
    EXPECT_EQ(r->status, expect_status) << r->body;
    return json::parse(r->body);
  }
  // POSTs and collects the SSE events ("data: ..." payloads) of a streaming response.
  std::vector<std::string> post_stream(const std::string& path, const json& body, size_t* n_reads = nullptr) {
    auto c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string raw;
    size_t reads = 0;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      raw.append(d, n);
      ++reads;
      return true;
    };
    httplib::Response res;
    httplib::Error err;
    EXPECT_TRUE(c.send(req, res, err)) << httplib::to_string(err);
    EXPECT_EQ(res.status, 200);
    EXPECT_NE(res.get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    if (n_reads) *n_reads = reads;
    std::vector<std::string> events;
    for (size_t p = 0; (p = raw.find("data: ", p)) != std::string::npos;) {
      size_t e = raw.find("\n\n", p);
      EXPECT_NE(e, std::string::npos) << "unterminated event";
      if (e == std::string::npos) break;
      events.push_back(raw.substr(p + 6, e - p - 6));
      p = e + 2;
    }
    return events;
  }

  static inline test_util::LoadedTiny* served_ = nullptr;
  static inline test_util::LoadedTiny* oracle_ = nullptr;
  static inline Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
};

const std::vector<tokenizer::ChatMessage> kChat = {{"system", "You are a helpful assistant."},
                                                   {"user", "Tell me a story about a ship."}};
json chat_messages() {
  json m = json::array();
  for (const auto& x : kChat) m.push_back({{"role", x.role}, {"content", x.content}});
  return m;
}

TEST_F(ServerTest, HealthAndModels) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "perry-test");
  EXPECT_EQ(c.Get("/v1/models/perry-test")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/gpt-4")->status, 404);
}

TEST_F(ServerTest, ChatNonStreamEqualsGenerator) {
  auto expect = test_util::oracle(*oracle_, test_util::chat_prompt(*oracle_->tok, kChat), 40,
                                test_util::chat_eos(*oracle_->model, *oracle_->tok));
  ASSERT_FALSE(expect.text.empty());
  json j = post("/v1/chat/completions",
                {{"model", "anything"}, {"messages", chat_messages()}, {"max_tokens", 40}, {"temperature", 0}, {"user", "u1"}});
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "perry-test");
  EXPECT_TRUE(j["id"].is_string());
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], expect.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], std::string(runtime::finish_reason_name(expect.st.finish)));
  EXPECT_EQ(j["usage"]["prompt_tokens"], expect.st.prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], expect.st.generated_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], expect.st.prompt_tokens + expect.st.generated_tokens);
}

TEST_F(ServerTest, CompletionNonStreamEqualsGenerator) {
  const std::string prompt = "The ship sailed out of the harbor";
  auto expect = test_util::oracle(*oracle_, oracle_->tok->encode(prompt, true), 30, test_util::completion_eos(*oracle_->model));
  ASSERT_FALSE(expect.text.empty());
  json j = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 30}, {"temperature", 0.0}});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], expect.text);
  EXPECT_EQ(j["usage"]["completion_tokens"], expect.st.generated_tokens);
  EXPECT_EQ(j["usage"]["prompt_tokens"], expect.st.prompt_tokens);
}

TEST_F(ServerTest, ChatStreamEqualsGenerator) {
  auto expect = test_util::oracle(*oracle_, test_util::chat_prompt(*oracle_->tok, kChat), 40,
                                test_util::chat_eos(*oracle_->model, *oracle_->tok));
  size_t reads = 0;
  auto ev = post_stream("/v1/chat/completions",
                        {{"messages", chat_messages()}, {"max_tokens", 40}, {"temperature", 0}, {"stream", true},
                         {"stream_options", {{"include_usage", true}}}},
                        &reads);
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev.back(), "[DONE]");
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  int content_chunks = 0;
  std::string finish;
  for (size_t i = 1; i + 2 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) {
      text += ch["delta"]["content"].get<std::string>();
      ++content_chunks;
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, expect.text);
  EXPECT_GT(content_chunks, 1) << "the text came in one piece, not streamed";
  EXPECT_GT(reads, 2u) << "the stream arrived in one read (buffered, not streamed)";
  EXPECT_EQ(finish, std::string(runtime::finish_reason_name(expect.st.finish)));
  json usage = json::parse(ev[ev.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], expect.st.generated_tokens);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], expect.st.prompt_tokens);
}

TEST_F(ServerTest, CompletionStreamEqualsGenerator) {
  const std::string prompt = "Once upon a time, there was a";
  auto expect = test_util::oracle(*oracle_, oracle_->tok->encode(prompt, true), 24, test_util::completion_eos(*oracle_->model));
  auto ev = post_stream("/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}});
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_FALSE(c.contains("usage")) << "usage sent without stream_options.include_usage";
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expect.text);
  EXPECT_EQ(finish, std::string(runtime::finish_reason_name(expect.st.finish)));
}

TEST_F(ServerTest, ConcurrentRequestsEqualSequentialOnes) {
  const std::vector<std::string> prompts = {"The ship sailed out of the harbor", "Once upon a time, there was a",
                                            "In the morning the old man", "She opened the door and"};
  const int64_t n = 40;
  std::vector<test_util::OracleOut> expect;
  for (const auto& p : prompts) expect.push_back(test_util::oracle(*oracle_, oracle_->tok->encode(p, true), n, {}));
  const auto before = server_->scheduler().stats();
  std::vector<json> got(prompts.size());
  std::vector<std::thread> ts;
  for (size_t i = 0; i < prompts.size(); ++i)
    ts.emplace_back([&, i] {
      got[i] = post("/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true}});
    });
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i]["choices"][0]["text"], expect[i].text) << "request " << i;
    EXPECT_EQ(got[i]["usage"]["completion_tokens"], n);
  }
  const auto after = server_->scheduler().stats();
  EXPECT_EQ(after.finished - before.finished, 4);
  EXPECT_GE(after.max_batch_seqs, 2) << "concurrent requests never shared a forward step";
}

TEST_F(ServerTest, StopStringsCutTheTextAndAreNeverStreamed) {
  const std::string prompt = "The ship sailed out of the harbor";
  json full = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}});
  const std::string text = full["choices"][0]["text"];
  ASSERT_GE(text.size(), 20u);
  const std::string stop = text.substr(12, 3);  // a piece from the middle of the greedy text
  const std::string want = text.substr(0, text.find(stop));
  json j = post("/v1/completions",
                {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}, {"stop", {"zzzq", stop}}});
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  auto ev = post_stream("/v1/completions",
                        {{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}, {"stop", stop}, {"stream", true}});
  std::string streamed;
  for (size_t i = 0; i + 1 < ev.size(); ++i) streamed += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, want);
}

TEST_F(ServerTest, MaxTokensLimitsTheCompletion) {
  for (int64_t n : {0, 1, 7}) {
    json j = post("/v1/chat/completions",
                  {{"messages", chat_messages()}, {"max_completion_tokens", n}, {"temperature", 0}, {"ignore_eos", true}});
    EXPECT_EQ(j["usage"]["completion_tokens"], n);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    if (n == 0) {
      EXPECT_EQ(j["choices"][0]["message"]["content"], "");
    }
  }
}

TEST_F(ServerTest, SampledRequestsWithASeedAreReproducible) {
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 1.0}, {"top_k", 50},
               {"top_p", 0.95}, {"min_p", 0.01}, {"repetition_penalty", 1.1}, {"seed", 1234}, {"ignore_eos", true}};
  json a = post("/v1/completions", body), b = post("/v1/completions", body);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(a["usage"]["completion_tokens"], 20);
}

void expect_error_json(const std::string& body, const std::string& where) {
  json j = json::parse(body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << where << ": not JSON: " << body;
  ASSERT_TRUE(j.contains("error")) << where << ": " << body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << where;
  EXPECT_TRUE(e["type"].is_string()) << where;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << where;
}

TEST_F(ServerTest, BadRequestsGiveOpenAIErrors) {
  struct Case {
    const char* path;
    std::string body;
    const char* param;  // expected error.param ("" = null)
  };
  const std::string msgs = chat_messages().dump();
  const Case cases[] = {
      {"/v1/chat/completions", "{\"messages\": [", ""},
      {"/v1/chat/completions", "[1, 2]", ""},
      {"/v1/chat/completions", "{\"messages\": \"hi\"}", "messages"},
      {"/v1/chat/completions", "{}", "messages"},
      {"/v1/chat/completions", "{\"messages\": []}", "messages"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "messages[0].role"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"temperature\": \"hot\"}", "temperature"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"temperature\": -1}", "temperature"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"max_tokens\": -1}", "max_tokens"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"max_tokens\": \"5\"}", "max_tokens"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"max_tokens\": 2.5}", "max_tokens"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"n\": 2}", "n"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"top_p\": 0}", "top_p"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stream\": \"yes\"}", "stream"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stop\": 5}", "stop"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stop\": [\"a\", 1]}", "stop"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stop\": [\"\"]}", "stop"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stop\": " + json(std::vector<std::string>(17, "x")).dump() + "}", "stop"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"frequency_penalty\": 0.5}", "frequency_penalty"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"logprobs\": true}", "logprobs"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"tools\": [{\"type\": \"function\"}]}", "tools"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"bogus_field\": 1}", "bogus_field"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"stream_options\": {\"include_usage\": true}}", "stream_options"},
      {"/v1/chat/completions", "{\"messages\": " + msgs + ", \"model\": 7}", "model"},
      {"/v1/completions", "{\"prompt\": [1, 2, 3]}", "prompt"},
      {"/v1/completions", "{\"prompt\": \"\"}", "prompt"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"echo\": true}", "echo"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"messages\": []}", "messages"},
      {"/v1/completions", std::string("{\"prompt\": \"bad \xff\xfe utf8\"}"), ""},
      {"/v1/completions", std::string("{\"prompt\": \"lone \\udc00 surrogate\"}"), ""},
  };
  auto c = client();
  for (const auto& k : cases) {
    auto r = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, 400) << k.body << " -> " << r->body;
    expect_error_json(r->body, k.body);
    json e = json::parse(r->body, nullptr, false);
    if (!e.is_discarded() && e.contains("error")) {
      if (*k.param) EXPECT_EQ(e["error"]["param"], k.param) << k.body;
      else EXPECT_TRUE(e["error"]["param"].is_null()) << k.body;
      EXPECT_EQ(e["error"]["type"], "invalid_request_error") << k.body;
    }
  }
  // Harmless fields are accepted (zero penalties, user, response_format text).
  post("/v1/chat/completions", {{"messages", chat_messages()}, {"max_tokens", 2}, {"frequency_penalty", 0},
                                {"presence_penalty", 0.0}, {"user", "x"}, {"response_format", {{"type", "text"}}}});
}

TEST_F(ServerTest, PromptLongerThanTheContextSaysHowLong) {
  std::string prompt;
  for (int i = 0; i < 600; ++i) prompt += " ship";
  const size_t n = oracle_->tok->encode(prompt, true).size();
  ASSERT_GE(n, size_t(kCtx));
  auto c = client();
  auto r = c.Post("/v1/completions", json{{"prompt", prompt}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  json e = json::parse(r->body)["error"];
  const std::string msg = e["message"];
  EXPECT_NE(msg.find(std::to_string(n) + " tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kCtx)), std::string::npos) << msg;
  EXPECT_EQ(e["code"], "context_length_exceeded");
}

TEST_F(ServerTest, RoutesMethodsAndBodySize) {
  auto c = client();
  auto r = c.Get("/v1/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  expect_error_json(r->body, "404");
  r = c.Post("/v2/chat/completions", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  expect_error_json(r->body, "404 post");
  r = c.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  expect_error_json(r->body, "405");
  r = c.Post("/health", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Delete("/v1/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  // curl -d sends bodies as form data; they reach the handler whatever their size below the cap.
  std::string words;
  for (int i = 0; i < 3000; ++i) words += "word ";
  r = c.Post("/v1/completions", json{{"prompt", words}}.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded") << r->body;
  const std::string big = json{{"prompt", std::string(100 << 10, 'a')}}.dump();
  r = c.Post("/v1/completions", big, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  expect_error_json(r->body, "413");
}

TEST_F(ServerTest, DisconnectedStreamingClientCancelsItsSequence) {
  const auto before = server_->scheduler().stats();
  const int64_t max_tokens = 480;
  auto c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"temperature", 0},
                  {"ignore_eos", true}, {"stream", true}}
                 .dump();
  req.set_header("Content-Type", "application/json");
  std::string raw;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, n);
    return raw.find("\"text\"") == std::string::npos;  // hang up after the first text chunk
  };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  c.stop();
  EXPECT_NE(raw.find("\"text\""), std::string::npos);
  // Bounded wait for the scheduler to notice (its next write to the closed socket fails).
  SchedulerStats st;
  for (int i = 0; i < 3000; ++i) {
    st = server_->scheduler().stats();
    if (st.cancelled > before.cancelled) break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(st.cancelled, before.cancelled + 1);
  EXPECT_LT(st.cancelled_tokens - before.cancelled_tokens, max_tokens);
  EXPECT_EQ(st.finished, before.finished + 1);
  // The server keeps serving.
  json j = post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 2}});
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int64_t>() > 0, true);
}

}  // namespace
}  // namespace perry::server

namespace perry::server {
namespace {

// Graceful stop: a running stream finishes completely, new requests get 503 meanwhile.
TEST(ServerShutdown, DrainsRunningRequestsAndRefusesNewOnes) {
  auto t = test_util::load_tiny();
  ServerOptions o;
  o.port = 0;
  o.model_dir = test_util::model_dir();
  o.n_parallel = 1;
  o.ctx = 512;
  o.log_requests = false;
  Server server(*t.model, *t.tok, o);
  const int port = server.bind();
  std::thread run([&] { server.run(); });
  const int64_t n = 200;
  std::string raw;
  std::thread streamer([&] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", true},
                    {"stream", true}, {"stream_options", {{"include_usage", true}}}}
                   .dump();
    req.content_receiver = [&](const char* d, size_t len, uint64_t, uint64_t) {
      raw.append(d, len);
      return true;
    };
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
  });
  for (int i = 0; i < 3000 && server.scheduler().stats().active == 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(server.scheduler().stats().active, 1);
  std::thread stopper([&] { server.stop(std::chrono::milliseconds(60000)); });
  for (int i = 0; i < 3000 && server.scheduler().accepting(); ++i) std::this_thread::sleep_for(1ms);
  int refused = 0;
  {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 1}}.dump(), "application/json");
    // The stream still has most of its tokens to go, so the listener is open during the drain.
    EXPECT_TRUE(r);  // (no ASSERT: the threads below must still be joined)
    if (r) {
      refused = r->status;
      expect_error_json(r->body, "503");
    }
  }
  streamer.join();
  stopper.join();
  run.join();
  EXPECT_EQ(refused, 503);
  EXPECT_NE(raw.find("\"completion_tokens\":" + std::to_string(n)), std::string::npos) << raw.substr(raw.size() - 300);
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace perry::server
