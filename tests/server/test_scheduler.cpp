// Scheduler without HTTP: continuous batching must give each sequence the tokens the
// single-sequence generator gives it (oracle: runtime::generate).
#include <gtest/gtest.h>

#include "core/error.h"
#include "server/scheduler.h"
#include "server_test_util.h"

namespace perry::server {
namespace {

using namespace std::chrono_literals;
using test_util::LoadedTiny;

LoadedTiny& tiny() {
  static LoadedTiny t = test_util::load_tiny();
  return t;
}

RequestResult wait(RequestChannel& ch, std::string* text) {
  for (int i = 0; i < 6000 && !ch.next(text, 10ms); ++i) {
  }
  EXPECT_TRUE(ch.next(text, 0ms)) << "request did not finish";
  return ch.result();
}

// A scheduler's options: n_slots sequences of ctx positions each.
SchedulerOptions options(int64_t n_slots, int64_t ctx) {
  SchedulerOptions so;
  so.n_slots = n_slots;
  so.ctx = ctx;
  return so;
}

const char* kPrompts[] = {"The ship sailed out of the harbor", "Once upon a time, there was a",
                          "In the morning the old man", "She opened the door and"};

// Batching puts M = (number of sequences) rows through every linear layer instead of M = 1, so a
// different kernel (GEMM instead of GEMV) computes each row. Rows are independent (activation
// scales are per token), so greedy tokens must agree; checked for the float checkpoint and the
// integer modes.
class SchedulerModes : public ::testing::TestWithParam<std::string> {};

TEST_P(SchedulerModes, ConcurrentSequencesMatchSingleSequenceGenerator) {
  LoadedTiny owned;
  if (GetParam() != "bf16") owned = test_util::load_tiny(quant::parse_quant_mode(GetParam()));
  auto& t = GetParam() == "bf16" ? tiny() : owned;
  const auto eos = test_util::completion_eos(*t.model);
  // Different lengths so prefill chunks and decode tokens of different sequences share steps.
  const int64_t max_tokens[] = {40, 25, 33, 48};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<test_util::OracleOut> expect;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(t.tok->encode(kPrompts[i], true));
    expect.push_back(test_util::oracle(t, prompts.back(), max_tokens[i], {}));  // no eos: full length
    ASSERT_EQ(expect.back().st.generated_tokens, max_tokens[i]);
  }
  SchedulerOptions so = options(4, 512);
  so.prefill_chunk = 3;  // prompts take several steps, overlapping other sequences' decode
  Scheduler sched(*t.model, *t.tok, so);
  // Queued as one batch: submitted one by one, a busy machine (CI runs tests two at a time) could
  // delay the test thread until the first sequence had finished (seen once: max_batch_seqs 3).
  std::vector<GenRequest> reqs(4);
  for (int i = 0; i < 4; ++i) {
    reqs[size_t(i)].prompt = prompts[size_t(i)];
    reqs[size_t(i)].max_new_tokens = max_tokens[i];
  }
  const std::vector<std::shared_ptr<RequestChannel>> chs = sched.submit_all(reqs);
  ASSERT_EQ(chs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    std::string text;
    RequestResult r = wait(*chs[size_t(i)], &text);
    EXPECT_EQ(r.tokens, expect[size_t(i)].st.tokens) << "sequence " << i;
    EXPECT_EQ(text, expect[size_t(i)].text) << "sequence " << i;
    EXPECT_EQ(r.finish, runtime::FinishReason::Length);
    EXPECT_EQ(r.prompt_tokens, int64_t(prompts[size_t(i)].size()));
  }
  auto st = sched.stats();
  EXPECT_EQ(st.max_batch_seqs, 4) << "the four sequences never shared a forward step";
  EXPECT_EQ(st.finished, 4);
  EXPECT_EQ(st.active, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, SchedulerModes, ::testing::Values("bf16", "w8a8", "w4a8-g128"));

TEST(Scheduler, MoreRequestsThanSlotsQueueAndMatch) {
  auto& t = tiny();
  const auto eos = test_util::completion_eos(*t.model);
  Scheduler sched(*t.model, *t.tok, options(2, 256));
  std::vector<std::shared_ptr<RequestChannel>> chs;
  for (int i = 0; i < 4; ++i) {
    GenRequest r;
    r.prompt = t.tok->encode(kPrompts[i], true);
    r.max_new_tokens = 20;
    r.eos_ids = eos;
    chs.push_back(sched.submit(r));
  }
  std::vector<RequestResult> got;
  for (auto& ch : chs) {
    std::string text;
    got.push_back(wait(*ch, &text));
  }
  sched.stop();  // the oracle needs the model to itself
  for (int i = 0; i < 4; ++i) {
    auto e = test_util::oracle(t, t.tok->encode(kPrompts[i], true), 20, eos, {}, 256);
    EXPECT_EQ(got[size_t(i)].tokens, e.st.tokens) << "request " << i;
  }
  EXPECT_LE(sched.stats().max_batch_seqs, 2);
}

// Greedy decoding of an unchanged batch runs as one Model::decode_greedy run; a request that
// arrives meanwhile must end the run and join the batch at once, not wait for the run's end.
TEST(Scheduler, ADecodeRunYieldsToAWaitingRequest) {
  auto& t = tiny();
  Scheduler sched(*t.model, *t.tok, options(2, 512));
  GenRequest a, b;
  a.prompt = t.tok->encode(kPrompts[0], true);
  a.max_new_tokens = 400;
  b.prompt = t.tok->encode(kPrompts[1], true);
  b.max_new_tokens = 10;
  auto ca = sched.submit(a);
  std::string first;
  for (int i = 0; i < 6000 && first.empty(); ++i) ca->next(&first, 10ms);  // a is decoding
  ASSERT_FALSE(first.empty());
  auto cb = sched.submit(b);
  std::string text_b, text_a = first;
  const RequestResult rb = wait(*cb, &text_b);
  const RequestResult ra = wait(*ca, &text_a);
  EXPECT_EQ(sched.stats().max_batch_seqs, 2) << "b waited for a's run to end";
  sched.stop();
  EXPECT_EQ(rb.tokens, test_util::oracle(t, b.prompt, 10, {}, {}, 512).st.tokens);
  EXPECT_EQ(ra.tokens, test_util::oracle(t, a.prompt, 400, {}, {}, 512).st.tokens);
}

TEST(Scheduler, RejectsPromptsThatDoNotFitAndEmptyPrompts) {
  auto& t = tiny();
  Scheduler sched(*t.model, *t.tok, options(1, 16));
  GenRequest r;
  r.prompt.assign(16, 5);
  try {
    sched.submit(r);
    FAIL() << "a 16-token prompt fit a 16-token context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16 tokens"), std::string::npos) << e.what();
  }
  r.prompt.clear();
  EXPECT_THROW(sched.submit(r), Error);
  r.prompt = {1, 2, int32_t(t.model->config().vocab_size)};
  EXPECT_THROW(sched.submit(r), Error);
}

// submit_all checks every request before queueing any: one bad request in a batch queues none of
// them; a good batch is queued whole and each request finishes on its own channel.
TEST(Scheduler, SubmitAllQueuesAllOrNone) {
  auto& t = tiny();
  Scheduler sched(*t.model, *t.tok, options(2, 256));
  std::vector<GenRequest> reqs(3);
  for (int i = 0; i < 3; ++i) {
    reqs[size_t(i)].prompt = t.tok->encode(kPrompts[i], true);
    reqs[size_t(i)].max_new_tokens = 5;
  }
  reqs[1].prompt.clear();
  EXPECT_THROW(sched.submit_all(reqs), Error);
  EXPECT_EQ(sched.stats().submitted, 0) << "a batch with a bad request queued some of it";
  reqs[1].prompt = t.tok->encode(kPrompts[1], true);
  const auto chs = sched.submit_all(reqs);
  ASSERT_EQ(chs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    std::string text;
    EXPECT_EQ(wait(*chs[size_t(i)], &text).tokens.size(), 5u) << "request " << i;
  }
  EXPECT_EQ(sched.stats().submitted, 3);
  EXPECT_EQ(sched.stats().finished, 3);
}

TEST(Scheduler, ContextFullEndsWithLengthAtTheCapacity) {
  auto& t = tiny();
  Scheduler sched(*t.model, *t.tok, options(1, 24));
  GenRequest r;
  r.prompt = t.tok->encode(kPrompts[0], true);
  r.max_new_tokens = 1000;
  std::string text;
  RequestResult res = wait(*sched.submit(r), &text);
  EXPECT_EQ(res.finish, runtime::FinishReason::ContextFull);
  // The last sampled token is never fed back, so prompt + generated = capacity + 1.
  EXPECT_EQ(res.prompt_tokens + res.completion_tokens, 25);
}

TEST(Scheduler, CancelledSequenceFreesItsSlot) {
  auto& t = tiny();
  Scheduler sched(*t.model, *t.tok, options(1, 512));
  GenRequest r;
  r.prompt = t.tok->encode(kPrompts[1], true);
  r.max_new_tokens = 400;
  auto ch = sched.submit(r);
  std::string text;
  for (int i = 0; i < 1000 && text.empty(); ++i) ch->next(&text, 10ms);
  ASSERT_FALSE(text.empty());
  ch->cancel();
  RequestResult res = wait(*ch, &text);
  EXPECT_EQ(res.finish, runtime::FinishReason::Cancelled);
  EXPECT_LT(res.completion_tokens, 400);
  // The only slot is free again: a new request runs to completion.
  r.max_new_tokens = 3;
  RequestResult res2 = wait(*sched.submit(r), &text);
  EXPECT_EQ(res2.completion_tokens, 3);
  EXPECT_EQ(sched.stats().cancelled, 1);
}

}  // namespace
}  // namespace perry::server
