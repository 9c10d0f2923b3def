#include "server/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace perry::server {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

bool RequestChannel::next(std::string* text, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || !pending_.empty(); });
  text->append(pending_);
  pending_.clear();
  return finished_;
}

void RequestChannel::push(const std::string& text) {
  {
    std::lock_guard lk(mu_);
    pending_ += text;
  }
  cv_.notify_all();
}

void RequestChannel::finish(RequestResult r) {
  {
    std::lock_guard lk(mu_);
    result_ = std::move(r);
    finished_ = true;
  }
  cv_.notify_all();
}

struct Scheduler::Seq {
  Seq(GenRequest r, const tokenizer::Tokenizer& tok)
      : req(std::move(r)), sampler(req.sampling), dec(tok, true), stops(req.stop_strings) {}
  GenRequest req;
  std::shared_ptr<RequestChannel> ch = std::make_shared<RequestChannel>();
  int64_t slot = -1;
  size_t prompt_pos = 0;       // prompt tokens already in the cache
  int32_t next = -1;           // the token to feed at the next decode step
  std::vector<int32_t> history;  // prompt + generated, for the repetition penalty
  runtime::Sampler sampler;
  tokenizer::StreamDecoder dec;
  runtime::StopStringFilter stops;
  RequestResult res;
  double t_submit = 0, t_admit = 0;
  bool done = false;
};

Scheduler::Scheduler(model::Model& model, const tokenizer::Tokenizer& tok, SchedulerOptions opts)
    : model_(model), tok_(tok), opts_(std::move(opts)), cache_(model.make_cache(opts_.ctx, opts_.n_slots)) {
  PERRY_CHECK(opts_.n_slots >= 1, "--parallel must be at least 1, got {}", opts_.n_slots);
  PERRY_CHECK(opts_.ctx >= 2, "--ctx must be at least 2, got {}", opts_.ctx);
  PERRY_CHECK(opts_.prefill_chunk >= 1 && opts_.max_batch_tokens >= opts_.n_slots,
              "the batch token budget ({}) must cover one token per slot ({})", opts_.max_batch_tokens, opts_.n_slots);
  for (int64_t s = opts_.n_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::unique_ptr<Scheduler::Seq> Scheduler::checked_seq(GenRequest req) const {
  PERRY_CHECK(!req.prompt.empty(), "the prompt is empty (it encodes to no tokens)");
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t id : req.prompt)
    PERRY_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary (0..{})", id, vocab - 1);
  if (int64_t(req.prompt.size()) >= opts_.ctx)
    fail("the prompt is {} tokens but the context holds {} (prompt plus at least one generated token): "
         "shorten the prompt or start the server with a larger --ctx",
         req.prompt.size(), opts_.ctx);
  PERRY_CHECK(req.max_new_tokens >= 0, "max_tokens must be >= 0, got {}", req.max_new_tokens);
  runtime::validate_sampling(req.sampling);
  auto seq = std::make_unique<Seq>(std::move(req), tok_);
  seq->t_submit = now_s();
  seq->res.prompt_tokens = int64_t(seq->req.prompt.size());
  return seq;
}

std::shared_ptr<RequestChannel> Scheduler::submit(GenRequest req) {
  std::vector<GenRequest> one;
  one.push_back(std::move(req));
  return submit_all(std::move(one)).front();
}

std::vector<std::shared_ptr<RequestChannel>> Scheduler::submit_all(std::vector<GenRequest> reqs) {
  std::vector<std::unique_ptr<Seq>> seqs;
  seqs.reserve(reqs.size());
  for (GenRequest& r : reqs) seqs.push_back(checked_seq(std::move(r)));
  std::vector<std::shared_ptr<RequestChannel>> chs;
  chs.reserve(seqs.size());
  {
    std::lock_guard lk(mu_);
    if (stop_ || !accepting_) fail("the server is shutting down");
    for (auto& seq : seqs) {
      chs.push_back(seq->ch);
      queue_.push_back(std::move(seq));
      ++stats_.submitted;
    }
    stats_.queued = int64_t(queue_.size());
  }
  cv_.notify_all();
  return chs;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Scheduler::drain(std::chrono::milliseconds timeout) {
  accepting_ = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return stop_ || (queue_.empty() && stats_.active == 0); });
  if (queue_.empty() && stats_.active == 0) return;
  lk.unlock();
  stop();
}

void Scheduler::stop() {
  accepting_ = false;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::admit() {
  std::lock_guard lk(mu_);
  while (!free_slots_.empty() && !queue_.empty()) {
    std::unique_ptr<Seq> s = std::move(queue_.front());
    queue_.pop_front();
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    s->t_admit = now_s();
    s->history = s->req.prompt;
    cache_.reset(s->slot);
    active_.push_back(std::move(s));
  }
  stats_.queued = int64_t(queue_.size());
  stats_.active = int64_t(active_.size());
}

void Scheduler::finish(Seq& s, runtime::FinishReason why, bool flush) {
  if (s.done) return;
  if (flush) {
    // The held-back text (an incomplete character, a possible stop-string prefix), as generate() does.
    bool stopped = false;
    std::string tail = s.stops.push(s.dec.flush(), &stopped);
    tail += stopped ? "" : s.stops.flush();
    if (!tail.empty()) s.ch->push(tail);
  }
  const double t = now_s();
  s.res.finish = why;
  s.res.completion_tokens = int64_t(s.res.tokens.size());
  s.res.queue_s = (s.t_admit > 0 ? s.t_admit : t) - s.t_submit;
  s.res.total_s = t - s.t_submit;
  if (s.res.ttft_s == 0) s.res.ttft_s = s.res.total_s;
  s.done = true;
  {
    std::lock_guard lk(mu_);
    ++stats_.finished;
    if (s.slot >= 0) --stats_.active;  // before the client hears of it, so stats() is never stale
    if (why == runtime::FinishReason::Cancelled) {
      ++stats_.cancelled;
      stats_.cancelled_tokens += s.res.completion_tokens;
    }
  }
  if (opts_.on_finish) opts_.on_finish(s.req, s.res);
  s.ch->finish(s.res);
}

void Scheduler::on_token(Seq& s, int32_t tok) {
  const auto& eos = s.req.eos_ids;
  if (std::find(eos.begin(), eos.end(), tok) != eos.end()) return finish(s, runtime::FinishReason::Eos, true);
  s.res.tokens.push_back(tok);
  s.history.push_back(tok);
  bool stopped = false;
  std::string text = s.stops.push(s.dec.push(tok), &stopped);
  if (!text.empty()) s.ch->push(text);
  if (stopped) return finish(s, runtime::FinishReason::StopString, false);
  if (int64_t(s.res.tokens.size()) >= s.req.max_new_tokens) return finish(s, runtime::FinishReason::Length, true);
  if (cache_.length(s.slot) + 1 > cache_.capacity()) return finish(s, runtime::FinishReason::ContextFull, true);
  s.next = tok;
}

// Greedy decode steps of an unchanged batch (every sequence decoding) as one Model::decode_greedy
// run — on a GPU the steps go back to back, the host not between them. The run ends when a
// sequence finishes or is cancelled, when a waiting request could take a free slot, or at shutdown;
// the steps are bounded by each sequence's max_new_tokens and context. Returns the steps taken.
int64_t Scheduler::decode_run(const std::vector<model::SeqInput>& batch, const std::vector<Seq*>& seqs) {
  int64_t steps = INT64_MAX;
  for (const Seq* s : seqs)
    steps = std::min({steps, s->req.max_new_tokens - int64_t(s->res.tokens.size()),
                      cache_.capacity() - cache_.length(s->slot)});
  return model_.decode_greedy(batch, cache_, steps, [&](const std::vector<int32_t>& tok) {
    bool go = true;
    for (size_t i = 0; i < seqs.size(); ++i) {
      on_token(*seqs[i], tok[i]);
      go &= !seqs[i]->done && !seqs[i]->ch->cancelled();
    }
    std::lock_guard lk(mu_);
    return go && !stop_ && (queue_.empty() || free_slots_.empty());
  });
}

bool Scheduler::step() {
  admit();
  // Cancelled sequences and those asking for no tokens leave before the forward.
  for (auto& s : active_) {
    if (s->ch->cancelled()) finish(*s, runtime::FinishReason::Cancelled, false);
    else if (s->req.max_new_tokens == 0) finish(*s, runtime::FinishReason::Length, false);
  }
  std::vector<model::SeqInput> batch;
  std::vector<Seq*> seqs;
  std::vector<int64_t> chunk;  // prompt tokens fed per sequence (0 = a decode token)
  int64_t budget = opts_.max_batch_tokens;
  // Decode tokens first so running streams never wait behind a long prompt.
  for (auto& s : active_)
    if (!s->done && s->prompt_pos == s->req.prompt.size()) {
      batch.push_back({s->slot, &s->next, 1, false});
      seqs.push_back(s.get());
      chunk.push_back(0);
      --budget;
    }
  for (auto& s : active_) {
    if (s->done || s->prompt_pos == s->req.prompt.size() || budget <= 0) continue;
    const int64_t n = std::min({int64_t(s->req.prompt.size() - s->prompt_pos), opts_.prefill_chunk, budget});
    batch.push_back({s->slot, s->req.prompt.data() + s->prompt_pos, n, false});
    seqs.push_back(s.get());
    chunk.push_back(n);
    budget -= n;
  }
  if (!batch.empty()) {
    const int64_t vocab = model_.config().vocab_size;
    int64_t steps = 1;
    try {
      // Every sequence greedy: the tokens are picked where the logits are (Model::forward_greedy).
      const bool greedy = std::all_of(seqs.begin(), seqs.end(), [](const Seq* s) { return s->sampler.picks_greedy(); });
      const bool decode = std::all_of(chunk.begin(), chunk.end(), [](int64_t n) { return n == 0; });
      if (greedy && decode) {
        steps = decode_run(batch, seqs);
      } else {
        if (greedy) model_.forward_greedy(batch, cache_, picked_);
        else model_.forward(batch, cache_, logits_);
        for (size_t i = 0; i < seqs.size(); ++i) {
          Seq& s = *seqs[i];
          if (chunk[i] > 0) {
            s.prompt_pos += size_t(chunk[i]);
            if (s.prompt_pos < s.req.prompt.size()) continue;  // more prompt to go: logits unused
          }
          const int32_t tok =
              greedy ? picked_[i] : s.sampler.sample(logits_.data() + int64_t(i) * vocab, vocab, s.history);
          if (s.res.tokens.empty() && s.res.ttft_s == 0) s.res.ttft_s = now_s() - s.t_submit;
          on_token(s, tok);
        }
      }
    } catch (const std::exception& e) {
      // A failure inside the model is not the client's fault: every sequence of the batch fails.
      for (Seq* s : seqs) {
        s->res.error = e.what();
        finish(*s, runtime::FinishReason::Cancelled, false);
      }
    }
    std::lock_guard lk(mu_);
    stats_.steps += steps;
    stats_.max_batch_seqs = std::max<int64_t>(stats_.max_batch_seqs, int64_t(batch.size()));
    stats_.max_batch_tokens = std::max(stats_.max_batch_tokens, opts_.max_batch_tokens - budget);
  }
  bool any_done = false;
  for (auto& s : active_)
    if (s->done) {
      free_slots_.push_back(s->slot);
      any_done = true;
    }
  if (any_done) {
    active_.erase(std::remove_if(active_.begin(), active_.end(), [](const auto& s) { return s->done; }), active_.end());
    cv_.notify_all();  // drain() waits for the last sequence
  }
  return !batch.empty() || any_done;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !active_.empty(); });
      if (stop_) break;
    }
    step();
  }
  // Shutdown: everything still queued or running ends as cancelled.
  std::deque<std::unique_ptr<Seq>> rest;
  {
    std::lock_guard lk(mu_);
    rest.swap(queue_);
  }
  for (auto& s : active_) finish(*s, runtime::FinishReason::Cancelled, false);
  for (auto& s : rest) finish(*s, runtime::FinishReason::Cancelled, false);
  active_.clear();
  std::lock_guard lk(mu_);
  stats_.active = stats_.queued = 0;
}

}  // namespace perry::server
