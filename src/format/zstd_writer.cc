#include "format/zstd_writer.h"

#include <zstd.h>

#include <memory>
#include <new>
#include <string>

#include "shardpoint/error.h"

namespace shardpoint::format {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// This thread's compression context: creating one per item would allocate its tables for
// every small item.
ZSTD_CCtx* thread_context() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  if (!ctx) throw std::bad_alloc();
  return ctx.get();
}

void check(std::size_t ret, const char* what) {
  if (ZSTD_isError(ret)) throw UsageError(std::string("zstd ") + what + ": " + ZSTD_getErrorName(ret));
}

}  // namespace

ZstdWriter::ZstdWriter(ByteSink& target, int level, int workers) : target_(target), out_(ZSTD_CStreamOutSize()) {
  if (level < 1 || level > ZSTD_maxCLevel()) {
    throw UsageError("zstd level " + std::to_string(level) + " is outside 1.." + std::to_string(ZSTD_maxCLevel()));
  }
  ZSTD_CCtx* ctx = thread_context();
  check(ZSTD_CCtx_reset(ctx, ZSTD_reset_session_and_parameters), "reset");
  check(ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, level), "level");
  check(ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1), "checksum flag");
  // Workers need libzstd built with threads; without, the frame is compressed on this one.
  if (workers > 0) (void)ZSTD_CCtx_setParameter(ctx, ZSTD_c_nbWorkers, workers);
}

ZstdWriter::~ZstdWriter() {
  // An unfinished frame (an exception unwound the writer) leaves the context mid-frame.
  if (!finished_) (void)ZSTD_CCtx_reset(thread_context(), ZSTD_reset_session_only);
}

void ZstdWriter::pump(ByteSpan data, bool end) {
  ZSTD_CCtx* ctx = thread_context();
  ZSTD_inBuffer input{data.data(), data.size(), 0};
  const ZSTD_EndDirective mode = end ? ZSTD_e_end : ZSTD_e_continue;
  while (true) {
    ZSTD_outBuffer output{out_.data(), out_.size(), 0};
    const std::size_t remaining = ZSTD_compressStream2(ctx, &output, &input, mode);
    check(remaining, "compress");
    if (output.pos > 0) target_.write(ByteSpan(out_.data(), output.pos));
    const bool done = end ? remaining == 0 : input.pos == input.size;
    if (done) break;
  }
}

void ZstdWriter::write(ByteSpan data) {
  pump(data, false);
  consumed_ += data.size();
}

void ZstdWriter::finish() {
  pump({}, true);
  finished_ = true;
}

}  // namespace shardpoint::format
