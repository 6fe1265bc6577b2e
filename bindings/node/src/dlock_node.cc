// SPDX-License-Identifier: BSD-3-Clause
//
// The native half of dlock's Node.js binding: Node-API (node-addon-api, no
// V8 code) over libdlock's public C API. lib/index.js is the API users see;
// this file only moves calls off the JavaScript thread and results back.
//
// Node's own loop. Acquisitions (every kind dlock_acquire takes: plain,
// fair, read, write, semaphore; waits too), releases and extensions of the
// locks so acquired go through libdlock's asynchronous API (dlock/async.h)
// on Node's event loop: a uv_poll_t watches the client's dlock_async_fd and
// runs dlock_async_process on the JavaScript thread, whose callbacks settle
// the promises there and then. On Redis a try and a release are sent from
// this thread and their replies read here: no thread at all. The on_lost of
// those locks comes the same way (dlock_async_process runs it).
//
// Threads, for the rest. A call that may wait for a lock and has no
// asynchronous C call (acquireMulti, campaign) runs on a thread of its own;
// the other calls (status, setPermits, check, downgrade, and everything on
// locks of multi and campaign) run on libuv's thread pool, whose few
// threads a wait would hold for as long as it waits. Their results come
// back to the JavaScript thread through the client's one thread-safe
// function, as does the on_lost of their locks (called by libdlock's
// watchdog thread, which must not wait).
//
// Lifetimes. A lock handle keeps its client's object alive until it is
// released (dlock_release must come before dlock_client_free for the
// release to reach the server). A client's Core outlives dlock_client_free:
// the watchdog may still call on_lost until that returns, and on_lost
// reaches JavaScript through the Core's thread-safe function. The loop's
// handles (AsyncLoop) are closed by the client's detach hook, or before a
// dlock_client_free on the pool, and freed by libuv's close callbacks.

#define NAPI_VERSION 8
#define NAPI_DISABLE_CPP_EXCEPTIONS
#include <napi.h>

#include <dlock/async.h>
#include <uv.h>

#include <malloc.h>
#include <cstdint>
#include <cstring>
#include <string>
#include <dlfcn.h>
#include <pthread.h>
#include <vector>

namespace {

// ---- per-environment state ------------------------------------------------------

struct Addon {
    Napi::FunctionReference lock_ctor;   // the native Lock class
    Napi::FunctionReference make_error;  // lib/index.js: (code, message) -> Error
};

Napi::Value MakeError(Napi::Env env, int code, const std::string &message)
{
    Addon *addon = env.GetInstanceData<Addon>();
    std::string text = message.empty() ? dlock_strerror(code) : message;
    if (addon == nullptr || addon->make_error.IsEmpty())
        return Napi::Error::New(env, text).Value();
    return addon->make_error.Call({Napi::Number::New(env, code), Napi::String::New(env, text)});
}

// Throws the error lib/index.js makes for code (a bad argument found here,
// before any call into libdlock).
Napi::Value Throw(Napi::Env env, int code, const std::string &message)
{
    Napi::Value err = MakeError(env, code, message);
    if (!env.IsExceptionPending())
        napi_throw(env, err);
    return env.Undefined();
}

// The text of a JavaScript string argument; false (and an exception) if it
// is not a string or holds a NUL, which C would cut the text at.
bool Text(Napi::Env env, const Napi::Value &v, const char *what, std::string *out)
{
    if (!v.IsString()) {
        Throw(env, DLOCK_EINVAL, std::string(what) + " must be a string");
        return false;
    }
    *out = v.As<Napi::String>().Utf8Value();
    if (out->find('\0') != std::string::npos) {
        Throw(env, DLOCK_EINVAL, std::string(what) + " must not contain a NUL character");
        return false;
    }
    return true;
}

// An optional string argument: null or undefined give none.
bool OptText(Napi::Env env, const Napi::Value &v, const char *what, std::string *out,
             bool *has)
{
    *has = !(v.IsNull() || v.IsUndefined());
    return !*has || Text(env, v, what, out);
}

int64_t Int(const Napi::Value &v)
{
    return v.IsNumber() ? v.As<Napi::Number>().Int64Value() : 0;
}

// ---- the client's core ----------------------------------------------------------

// A message for the JavaScript thread, sent through Core::tsfn.
struct Msg {
    virtual ~Msg() = default;
    virtual void Deliver(Napi::Env env, Napi::Function on_lost) = 0;
};

void DeliverMsg(Napi::Env env, Napi::Function on_lost, void *, Msg *msg)
{
    // env is null when the environment is being torn down: drop the message.
    if (env != nullptr)
        msg->Deliver(env, on_lost);
    delete msg;
}

using Tsfn = Napi::TypedThreadSafeFunction<void, Msg, DeliverMsg>;

struct AsyncLoop;

struct Core {
    dlock_client *c = nullptr;
    Tsfn tsfn;
    int busy = 0;  // waits running and locks held
    bool freed = false;
    napi_env env = nullptr;
    // The on_lost dispatcher of lib/index.js, called straight from
    // dlock_async_process for the locks acquired through async.h.
    Napi::FunctionReference lost_fn;
    // What the loop's callbacks run JavaScript in (async_hooks' context
    // and resource: one object for every callback, as a handle of Node's
    // own passes its object each time).
    napi_async_context actx = nullptr;
    napi_ref resource = nullptr;
    AsyncLoop *loop = nullptr;  // attached at the first asynchronous call
    int inflight = 0;           // asynchronous requests whose callback is due
    // In a dlock_async_process run by the loop (LoopProcess): a callback
    // of libdlock's opens its own scopes then (JsScope).
    bool in_pass = false;

    ~Core()
    {
        if (actx != nullptr)
            napi_async_destroy(env, actx);
        if (resource != nullptr)
            napi_delete_reference(env, resource);
    }

    // A client keeps the process alive while it waits for a lock or holds
    // one (its watchdog renews it, and its signal may yet abort), as an
    // open socket would; an idle client does not.
    void Hold(Napi::Env env)
    {
        if (busy++ == 0) {
            tsfn.Ref(env);
            RefLoop(true);
        }
    }
    void Drop(Napi::Env env)
    {
        if (--busy == 0 && !freed) {
            tsfn.Unref(env);
            RefLoop(false);
        }
    }

    void RefLoop(bool on);
    int Attach(std::string *message);
};

// The client's descriptor and deadline on Node's loop (after
// include/dlock/adapters/libuv.h, with the handles referenced only while
// the client is busy, and JavaScript callbacks run in a callback scope).
struct AsyncLoop {
    Core *core;
    uv_poll_t poll;
    uv_timer_t timer;
    bool detached = false;  // closing: nothing may touch core->c any more
    int open = 0;           // handles not closed yet; freed at 0
};

void LoopCleanup(void *arg);

void LoopClosed(uv_handle_t *h)
{
    AsyncLoop *l = static_cast<AsyncLoop *>(h->data);
    if (--l->open == 0)
        delete l;
}

// Stops watching, for good: the client is being freed (its detach hook),
// is about to be freed on the pool, or the environment goes.
void LoopClose(AsyncLoop *l, bool from_cleanup = false)
{
    if (l->detached)
        return;
    l->detached = true;
    if (l->core->loop == l)
        l->core->loop = nullptr;
    if (!from_cleanup)
        napi_remove_env_cleanup_hook(l->core->env, LoopCleanup, l);
    uv_close(reinterpret_cast<uv_handle_t *>(&l->poll), LoopClosed);
    uv_close(reinterpret_cast<uv_handle_t *>(&l->timer), LoopClosed);
}

extern "C" void LoopDetach(void *arg)
{
    LoopClose(static_cast<AsyncLoop *>(arg));
}

// The environment goes with the client still open (a worker that ends, the
// process's exit): its loop must not keep our handles.
void LoopCleanup(void *arg)
{
    AsyncLoop *l = static_cast<AsyncLoop *>(arg);
    if (l->detached)
        return;
    dlock_async_set_detach(l->core->c, nullptr, nullptr);
    LoopClose(l, true);
}

void LoopTimer(uv_timer_t *t);

void LoopArm(AsyncLoop *l)
{
    int64_t ms = dlock_async_timeout_ms(l->core->c);
    if (ms < 0)
        uv_timer_stop(&l->timer);
    else
        uv_timer_start(&l->timer, LoopTimer, static_cast<uint64_t>(ms), 0);
}

// Runs the callbacks that are due, on the JavaScript thread (each opens
// its own scopes: JsScope), then asks for the next deadline.
void LoopProcess(AsyncLoop *l)
{
    if (l->detached)
        return;
    Core *core = l->core;
    core->in_pass = true;
    dlock_async_process(core->c);
    core->in_pass = false;
    // The client may have been freed meanwhile (a callback, or a
    // continuation at the scope's end, closed it): then l is closing.
    if (!l->detached)
        LoopArm(l);
}

// Opened first by every callback of libdlock's, on the JavaScript thread.
// In a loop's pass: a handle scope and a callback scope, whose close, when
// the callback ends, runs the process.nextTick queue and the microtasks
// (the continuations of the promise it settled), as Node does after any
// callback. They run inside dlock_async_process, where async.h lets them
// start requests (the release that follows an acquisition, the next try):
// a request started there is sent at once and its deadline taken by the
// LoopArm after the pass, where one started outside a pass also wakes the
// loop through the descriptor. Elsewhere (dlock_client_free from Free)
// JavaScript is on the stack already: nothing to open.
class JsScope {
  public:
    explicit JsScope(Core *core) : env_(core->env)
    {
        if (!core->in_pass)
            return;
        napi_value resource;
        napi_open_handle_scope(env_, &hs_);
        if (napi_get_reference_value(env_, core->resource, &resource) != napi_ok ||
            napi_open_callback_scope(env_, resource, core->actx, &cs_) != napi_ok)
            cs_ = nullptr;
    }
    ~JsScope()
    {
        if (cs_ != nullptr)
            napi_close_callback_scope(env_, cs_);
        if (hs_ != nullptr)
            napi_close_handle_scope(env_, hs_);
    }
    JsScope(const JsScope &) = delete;
    JsScope &operator=(const JsScope &) = delete;

  private:
    napi_env env_;
    napi_handle_scope hs_ = nullptr;
    napi_callback_scope cs_ = nullptr;
};

void LoopPoll(uv_poll_t *p, int, int)
{
    LoopProcess(static_cast<AsyncLoop *>(p->data));
}

void LoopTimer(uv_timer_t *t)
{
    LoopProcess(static_cast<AsyncLoop *>(t->data));
}

void Core::RefLoop(bool on)
{
    if (loop == nullptr)
        return;
    uv_handle_t *p = reinterpret_cast<uv_handle_t *>(&loop->poll);
    uv_handle_t *t = reinterpret_cast<uv_handle_t *>(&loop->timer);
    if (on) {
        uv_ref(p);
        uv_ref(t);
    } else {
        uv_unref(p);
        uv_unref(t);
    }
}

// Watches the client's descriptor on Node's loop, once (the first
// asynchronous call). DLOCK_OK, or a code with *message.
int Core::Attach(std::string *message)
{
    if (loop != nullptr)
        return DLOCK_OK;
    uv_loop_t *uvl = nullptr;
    if (napi_get_uv_event_loop(env, &uvl) != napi_ok || uvl == nullptr) {
        *message = "cannot find Node's event loop";
        return DLOCK_ENOMEM;
    }
    int fd = dlock_async_fd(c);
    if (fd < 0) {
        *message = dlock_error_message();
        return DLOCK_ENOMEM;
    }
    if (actx == nullptr) {
        napi_value res, name;
        if (napi_create_object(env, &res) != napi_ok ||
            napi_create_string_utf8(env, "dlock", NAPI_AUTO_LENGTH, &name) != napi_ok ||
            napi_async_init(env, res, name, &actx) != napi_ok) {
            actx = nullptr;
            *message = "cannot make the client's async context";
            return DLOCK_ENOMEM;
        }
        if (napi_create_reference(env, res, 1, &resource) != napi_ok) {
            napi_async_destroy(env, actx);
            actx = nullptr;
            resource = nullptr;
            *message = "cannot keep the client's async resource";
            return DLOCK_ENOMEM;
        }
    }
    AsyncLoop *l = new AsyncLoop;
    l->core = this;
    if (uv_poll_init(uvl, &l->poll, fd) != 0) {
        delete l;
        *message = "cannot watch the client's descriptor on Node's loop";
        return DLOCK_ENOMEM;
    }
    l->poll.data = l;
    l->open = 1;
    uv_timer_init(uvl, &l->timer);  // cannot fail
    l->timer.data = l;
    l->open = 2;
    napi_add_env_cleanup_hook(env, LoopCleanup, l);
    int rc = uv_poll_start(&l->poll, UV_READABLE, LoopPoll);
    if (rc != 0) {
        *message = std::string("cannot watch the client's descriptor: ") + uv_strerror(rc);
        LoopClose(l);
        return DLOCK_ENOMEM;
    }
    rc = dlock_async_set_detach(c, LoopDetach, l);
    if (rc != DLOCK_OK) {
        *message = dlock_error_message();
        LoopClose(l);
        return rc;
    }
    loop = l;
    if (busy == 0)
        RefLoop(false);
    LoopArm(l);
    return DLOCK_OK;
}

// on_lost's payload: which lock (lib/index.js's id) of which client.
struct Watch {
    Core *core;
    double id;
};

struct LostMsg : Msg {
    double id;
    int reason;
    LostMsg(double id_, int reason_) : id(id_), reason(reason_) {}
    void Deliver(Napi::Env env, Napi::Function on_lost) override
    {
        on_lost.Call({Napi::Number::New(env, id), Napi::Number::New(env, reason)});
    }
};

// Called by libdlock's watchdog thread: it must not wait, so the message is
// queued (the queue has no bound) and delivered on the JavaScript thread.
extern "C" void OnLost(dlock_lock *, int reason, void *payload)
{
    Watch *w = static_cast<Watch *>(payload);
    w->core->tsfn.NonBlockingCall(new LostMsg(w->id, reason));
}

// A JavaScript exception from a call made in a loop callback: Node's
// uncaughtException, as for any callback.
void Rethrow(Napi::Env env)
{
    if (env.IsExceptionPending()) {
        napi_value e;
        napi_get_and_clear_last_exception(env, &e);
        napi_fatal_exception(env, e);
    }
}

// The on_lost of a lock acquired through async.h: called by
// dlock_async_process, on the JavaScript thread (the loop's pass).
extern "C" void OnLostAsync(dlock_lock *, int reason, void *payload)
{
    Watch *w = static_cast<Watch *>(payload);
    JsScope js(w->core);
    Napi::Env env(w->core->env);
    Napi::HandleScope scope(env);
    if (w->core->lost_fn.IsEmpty())
        return;
    w->core->lost_fn.Call({Napi::Number::New(env, w->id), Napi::Number::New(env, reason)});
    Rethrow(env);
}

// ---- calls ----------------------------------------------------------------------

// One call into libdlock: Run on another thread, then Settle on the
// JavaScript thread, which resolves or rejects its promise.
class Call : public Msg {
  public:
    explicit Call(Napi::Env env) : deferred_(Napi::Promise::Deferred::New(env)) {}

    Napi::Promise Promise() { return deferred_.Promise(); }

    // Not on the JavaScript thread. libdlock's message is thread-local: it
    // is read here, right after the call, on the thread that made it.
    void Execute()
    {
        rc_ = Run();
        if (rc_ != DLOCK_OK)
            message_ = dlock_error_message();
    }

    // Rejects the promise of a call that could not be started.
    void Fail(Napi::Env env, int code, const char *message)
    {
        deferred_.Reject(MakeError(env, code, message));
    }

    void Settle(Napi::Env env)
    {
        Napi::HandleScope scope(env);
        if (rc_ == DLOCK_OK) {
            Napi::Value v = Result(env);
            if (env.IsExceptionPending()) {
                Napi::Error e = env.GetAndClearPendingException();
                deferred_.Reject(e.Value());
            } else {
                deferred_.Resolve(v);
            }
        } else {
            deferred_.Reject(MakeError(env, rc_, message_));
        }
    }

    // A spawned call's end, on the JavaScript thread.
    void Deliver(Napi::Env env, Napi::Function) override
    {
        Settle(env);
        Finish(env);
        spawned_->Drop(env);
    }

    // Runs the call on libuv's thread pool (a call that does not wait).
    void Queue(Napi::Env env);
    // Runs the call on a thread of its own (a call that may wait); false if
    // no thread could be had (the call was not started).
    bool Spawn(Napi::Env env, Core *core);

  protected:
    virtual int Run() = 0;
    virtual Napi::Value Result(Napi::Env env) { return env.Undefined(); }
    // After Settle, on the JavaScript thread: bookkeeping of the caller's.
    virtual void Finish(Napi::Env) {}

    int rc_ = DLOCK_OK;

  private:
    Napi::Promise::Deferred deferred_;
    std::string message_;
    Core *spawned_ = nullptr;

    friend class PoolWork;

  public:
    Core *Spawned() const { return spawned_; }
};

class PoolWork : public Napi::AsyncWorker {
  public:
    PoolWork(Napi::Env env, Call *call) : Napi::AsyncWorker(env, "dlock"), call_(call) {}
    ~PoolWork() override { delete call_; }
    void Execute() override { call_->Execute(); }
    void OnOK() override
    {
        call_->Settle(Env());
        call_->Finish(Env());
    }

  private:
    Call *call_;
};

void Call::Queue(Napi::Env env)
{
    (new PoolWork(env, this))->Queue();
}

void *SpawnMain(void *arg)
{
    Call *call = static_cast<Call *>(arg);
    call->Execute();
    // Delivered (and deleted) by DeliverMsg. If Node is shutting down the
    // call is dropped: nobody is left to tell.
    call->Spawned()->tsfn.BlockingCall(call);
    return nullptr;
}

bool Call::Spawn(Napi::Env env, Core *core)
{
    pthread_attr_t attr;
    pthread_t t;
    spawned_ = core;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    // A waiter's thread only sits in libdlock: 256 KiB of stack is plenty.
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int err = pthread_create(&t, &attr, SpawnMain, this);
    pthread_attr_destroy(&attr);
    if (err != 0)
        return false;
    core->Hold(env);
    return true;
}

// ---- the lock handle ------------------------------------------------------------

class Lock : public Napi::ObjectWrap<Lock> {
  public:
    static Napi::Function Define(Napi::Env env)
    {
        return DefineClass(env, "Lock",
                           {
                               InstanceMethod<&Lock::Fence>("fence"),
                               InstanceMethod<&Lock::Names>("names"),
                               InstanceMethod<&Lock::Fences>("fences"),
                               InstanceMethod<&Lock::Kind>("kind"),
                               InstanceMethod<&Lock::Lost>("lost"),
                               InstanceMethod<&Lock::ValidMs>("validMs"),
                               InstanceMethod<&Lock::Release>("release"),
                               InstanceMethod<&Lock::Extend>("extend"),
                               InstanceMethod<&Lock::Check>("check"),
                               InstanceMethod<&Lock::Downgrade>("downgrade"),
                           });
    }

    // A Lock still held when it goes is one whose environment is torn down
    // (a held lock keeps its client, and lib/index.js's client keeps it):
    // its lease runs out on the server, and its Watch stays, since the
    // watchdog may still use it.
    explicit Lock(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Lock>(info) {}

    // Set by the acquiring call's Result, on the JavaScript thread.
    // async: acquired through async.h, so released and extended there too.
    void Adopt(Napi::Env env, dlock_lock *l, Watch *w, const Napi::Object &client, Core *core,
               bool async)
    {
        lock_ = l;
        watch_ = w;
        client_ = Napi::Persistent(client);
        core_ = core;
        async_ = async;
        core->Hold(env);
    }

    dlock_lock *Handle(Napi::Env env)
    {
        if (lock_ == nullptr)
            Throw(env, DLOCK_EMISUSE, "the lock was released already");
        else if (busy_)
            Throw(env, DLOCK_EMISUSE, "another call on this lock is still running");
        return (lock_ != nullptr && !busy_) ? lock_ : nullptr;
    }

  private:
    Napi::Value Fence(const Napi::CallbackInfo &info)
    {
        if (lock_ == nullptr)
            return Throw(info.Env(), DLOCK_EMISUSE, "the lock was released already");
        return Napi::BigInt::New(info.Env(), static_cast<uint64_t>(dlock_lock_fence(lock_)));
    }

    Napi::Value Names(const Napi::CallbackInfo &info)
    {
        if (lock_ == nullptr)
            return Throw(info.Env(), DLOCK_EMISUSE, "the lock was released already");
        size_t n = dlock_lock_count(lock_);
        Napi::Array a = Napi::Array::New(info.Env(), n);
        for (size_t i = 0; i < n; i++)
            a.Set(static_cast<uint32_t>(i), Napi::String::New(info.Env(), dlock_lock_name_at(lock_, i)));
        return a;
    }

    Napi::Value Fences(const Napi::CallbackInfo &info)
    {
        if (lock_ == nullptr)
            return Throw(info.Env(), DLOCK_EMISUSE, "the lock was released already");
        size_t n = dlock_lock_count(lock_);
        Napi::Array a = Napi::Array::New(info.Env(), n);
        for (size_t i = 0; i < n; i++)
            a.Set(static_cast<uint32_t>(i),
                  Napi::BigInt::New(info.Env(), static_cast<uint64_t>(dlock_lock_fence_at(lock_, i))));
        return a;
    }

    Napi::Value Kind(const Napi::CallbackInfo &info)
    {
        if (lock_ == nullptr)
            return Throw(info.Env(), DLOCK_EMISUSE, "the lock was released already");
        return Napi::Number::New(info.Env(), dlock_lock_kind(lock_));
    }

    // No I/O: what the client knows now (the watchdog's last word).
    Napi::Value Lost(const Napi::CallbackInfo &info)
    {
        return Napi::Boolean::New(info.Env(), lock_ != nullptr && dlock_lock_lost(lock_) != 0);
    }

    Napi::Value ValidMs(const Napi::CallbackInfo &info)
    {
        if (lock_ == nullptr)
            return Napi::Number::New(info.Env(), 0);
        return Napi::Number::New(info.Env(), static_cast<double>(dlock_lock_valid_ms(lock_)));
    }

    class LockCall : public Call {
      public:
        LockCall(Napi::Env env, Lock *self, int op, int64_t ms)
            : Call(env), self_(self), keep_(Napi::Persistent(self->Value())), l_(self->lock_),
              op_(op), ms_(ms)
        {
            self->busy_ = true;
        }

      protected:
        int Run() override
        {
            switch (op_) {
            case 0: return dlock_release(l_);
            case 1: return dlock_lock_extend(l_, ms_);
            case 2: return dlock_lock_check(l_);
            default: return dlock_lock_downgrade(l_);
            }
        }

        void Finish(Napi::Env env) override
        {
            self_->busy_ = false;
            if (op_ == 0)
                self_->Forget(env);
        }

      private:
        Lock *self_;
        Napi::ObjectReference keep_;
        dlock_lock *l_;
        int op_;
        int64_t ms_;
    };

    // After a release, whatever its code: libdlock freed the handle, and
    // the watchdog is done with it and its Watch.
    void Forget(Napi::Env env)
    {
        core_->Drop(env);
        lock_ = nullptr;
        delete watch_;
        watch_ = nullptr;
        client_.Reset();
    }

    // A release or an extension through async.h, settled by Done.
    struct AsyncOp {
        Napi::Promise::Deferred deferred;
        Napi::ObjectReference keep;  // the Lock's object, until Done
        Lock *self;
        int op;
        AsyncOp(Napi::Env env, Lock *l, int o)
            : deferred(Napi::Promise::Deferred::New(env)), keep(Napi::Persistent(l->Value())),
              self(l), op(o)
        {
        }
    };

    // Called by dlock_async_process, on the JavaScript thread.
    static void Done(int rc, void *arg)
    {
        AsyncOp *a = static_cast<AsyncOp *>(arg);
        std::string message = rc != DLOCK_OK ? dlock_error_message() : "";
        Lock *self = a->self;
        JsScope js(self->core_);  // in a pass; from Free, JavaScript's scope
        Napi::Env env(self->core_->env);
        self->core_->inflight--;
        self->busy_ = false;
        if (a->op == 0)
            self->Forget(env);
        if (rc == DLOCK_OK)
            a->deferred.Resolve(env.Undefined());
        else
            a->deferred.Reject(MakeError(env, rc, message));
        delete a;
    }

    Napi::Value StartAsync(Napi::Env env, int op, int64_t ms)
    {
        AsyncOp *a = new AsyncOp(env, this, op);
        Napi::Promise p = a->deferred.Promise();
        int rc = op == 0 ? dlock_release_async(nullptr, lock_, Done, a)
                         : dlock_extend_async(nullptr, lock_, ms, Done, a);
        if (rc == DLOCK_OK) {
            busy_ = true;
            core_->inflight++;
            return p;
        }
        std::string message = dlock_error_message();
        if (op == 0) {
            // Out of memory, the lock untouched: the blocking release, from
            // this thread (allowed: one round trip). Otherwise (the client
            // freed) libdlock freed the handle.
            if (rc == DLOCK_ENOMEM) {
                rc = dlock_release(lock_);
                message = rc != DLOCK_OK ? dlock_error_message() : "";
            }
            Forget(env);
        }
        if (rc == DLOCK_OK)
            a->deferred.Resolve(env.Undefined());
        else
            a->deferred.Reject(MakeError(env, rc, message));
        delete a;
        return p;
    }

    Napi::Value Start(const Napi::CallbackInfo &info, int op, int64_t ms)
    {
        if (Handle(info.Env()) == nullptr)
            return info.Env().Undefined();
        if (async_ && (op == 0 || op == 1))
            return StartAsync(info.Env(), op, ms);
        LockCall *call = new LockCall(info.Env(), this, op, ms);
        Napi::Promise p = call->Promise();
        call->Queue(info.Env());
        return p;
    }

    Napi::Value Release(const Napi::CallbackInfo &info) { return Start(info, 0, 0); }
    Napi::Value Check(const Napi::CallbackInfo &info) { return Start(info, 2, 0); }
    Napi::Value Downgrade(const Napi::CallbackInfo &info) { return Start(info, 3, 0); }
    Napi::Value Extend(const Napi::CallbackInfo &info)
    {
        if (!info[0].IsNumber())
            return Throw(info.Env(), DLOCK_EINVAL, "extend's ttl must be a number of ms");
        return Start(info, 1, Int(info[0]));
    }

    dlock_lock *lock_ = nullptr;
    Watch *watch_ = nullptr;
    Napi::ObjectReference client_;  // kept alive while the lock is held
    Core *core_ = nullptr;
    bool busy_ = false;
    bool async_ = false;
};

// ---- the client -----------------------------------------------------------------

// An acquisition's options, from lib/index.js's positional arguments.
struct Options {
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    std::string owner, label;
    bool has_owner = false, has_label = false;
    double watch_id = 0;

    // args: ttl, wait, autoRenew, watchId, kind, owner, reentrant, permits, label
    bool Parse(Napi::Env env, const Napi::CallbackInfo &info, size_t at)
    {
        o.lease_ms = Int(info[at]);
        o.wait_ms = Int(info[at + 1]);
        o.auto_renew = info[at + 2].ToBoolean().Value() ? 1 : 0;
        watch_id = info[at + 3].IsNumber() ? info[at + 3].As<Napi::Number>().DoubleValue() : 0;
        o.kind = static_cast<int>(Int(info[at + 4]));
        if (!OptText(env, info[at + 5], "owner", &owner, &has_owner) ||
            !OptText(env, info[at + 8], "label", &label, &has_label))
            return false;
        o.reentrant = info[at + 6].ToBoolean().Value() ? 1 : 0;
        o.permits = static_cast<int>(Int(info[at + 7]));
        return true;
    }

    // Points the C options at this struct's strings (after any copy).
    // async: on_lost comes through dlock_async_process (async.h's locks).
    void Bind(Watch *w, bool async = false)
    {
        o.owner = has_owner ? owner.c_str() : nullptr;
        o.label = has_label ? label.c_str() : nullptr;
        o.on_lost = w ? (async ? OnLostAsync : OnLost) : nullptr;
        o.payload = w;
    }
};

class Client : public Napi::ObjectWrap<Client> {
  public:
    static Napi::Function Define(Napi::Env env)
    {
        return DefineClass(env, "Client",
                           {
                               InstanceMethod<&Client::Open>("open"),
                               InstanceMethod<&Client::Acquire>("acquire"),
                               InstanceMethod<&Client::AcquireMulti>("acquireMulti"),
                               InstanceMethod<&Client::Campaign>("campaign"),
                               InstanceMethod<&Client::Leader>("leader"),
                               InstanceMethod<&Client::Status>("status"),
                               InstanceMethod<&Client::SetPermits>("setPermits"),
                               InstanceMethod<&Client::Interrupt>("interrupt"),
                               InstanceMethod<&Client::Backend>("backend"),
                               InstanceMethod<&Client::Free>("free"),
                           });
    }

    // new Client(onLost): onLost(id, reason) is called on the JavaScript
    // thread for each watched lock found lost.
    explicit Client(const Napi::CallbackInfo &info) : Napi::ObjectWrap<Client>(info)
    {
        Napi::Env env = info.Env();
        if (!info[0].IsFunction()) {
            Throw(env, DLOCK_EINVAL, "Client needs its on_lost dispatcher");
            return;
        }
        core_ = new Core;
        core_->env = env;
        core_->lost_fn = Napi::Persistent(info[0].As<Napi::Function>());
        core_->tsfn = Tsfn::New(env, info[0].As<Napi::Function>(), "dlock", 0, 1, nullptr);
        core_->tsfn.Unref(env);
    }

    ~Client() override
    {
        // Reached with the client open only when the environment goes (or
        // lib/index.js dropped an open client, which it does not do): the
        // watchdog could still call on_lost, so the Core stays.
        if (core_ != nullptr && core_->freed) {
            delete core_;
        }
    }

  private:
    bool Ready(Napi::Env env)
    {
        if (core_ == nullptr || core_->c == nullptr || core_->freed || closing_) {
            Throw(env, DLOCK_EMISUSE, "the client is closed");
            return false;
        }
        return true;
    }

    // open(url, connectTimeoutMs, commandTimeoutMs, keyPrefix, clientName)
    Napi::Value Open(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct OpenCall : Call {
            Core *core;
            std::string url, prefix, name;
            bool has_prefix = false, has_name = false;
            dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
            dlock_client *out = nullptr;
            OpenCall(Napi::Env env, Core *c) : Call(env), core(c) {}
            int Run() override
            {
                o.key_prefix = has_prefix ? prefix.c_str() : nullptr;
                o.client_name = has_name ? name.c_str() : nullptr;
                return dlock_client_open(&out, url.c_str(), &o);
            }
            Napi::Value Result(Napi::Env env) override
            {
                core->c = out;
                return env.Undefined();
            }
        };
        if (core_ == nullptr || core_->c != nullptr || core_->freed)
            return Throw(env, DLOCK_EMISUSE, "the client is open already");
        OpenCall *call = new OpenCall(env, core_);
        if (!Text(env, info[0], "url", &call->url) ||
            !OptText(env, info[3], "keyPrefix", &call->prefix, &call->has_prefix) ||
            !OptText(env, info[4], "clientName", &call->name, &call->has_name)) {
            delete call;
            return env.Undefined();
        }
        if (info[1].IsNumber())
            call->o.connect_timeout_ms = Int(info[1]);
        if (info[2].IsNumber())
            call->o.command_timeout_ms = Int(info[2]);
        if (info[5].IsBoolean() && info[5].As<Napi::Boolean>().Value())
            call->o.flags = DLOCK_CLIENT_NO_THREADS;
        Napi::Promise p = call->Promise();
        call->Queue(env);
        return p;
    }

    // A call on the client (about the lock name, for most): the client's
    // object stays alive while it runs.
    struct ClientCall : Call {
        Napi::ObjectReference keep;
        Core *core;
        std::string name;
        ClientCall(Napi::Env env, Client *c)
            : Call(env), keep(Napi::Persistent(c->Value())), core(c->core_)
        {
        }
    };

    // Reads call's name from the first argument and runs it on the pool.
    Napi::Value QueueNamed(const Napi::CallbackInfo &info, ClientCall *call)
    {
        Napi::Env env = info.Env();

        if (!Text(env, info[0], "name", &call->name)) {
            delete call;
            return env.Undefined();
        }
        Napi::Promise p = call->Promise();
        call->Queue(env);
        return p;
    }

    // A call that gives a lock handle.
    class TakeCall : public ClientCall {
      public:
        TakeCall(Napi::Env env, Client *client) : ClientCall(env, client) {}
        ~TakeCall() override { delete watch_; }

        Options opts;
        Watch *watch_ = nullptr;

      protected:
        dlock_lock *out_ = nullptr;

        Napi::Value Result(Napi::Env env) override
        {
            Addon *addon = env.GetInstanceData<Addon>();
            Napi::Object obj = addon->lock_ctor.New({});
            if (env.IsExceptionPending()) {
                dlock_release(out_);  // cannot happen short of memory: give it back
                return env.Undefined();
            }
            Lock::Unwrap(obj)->Adopt(env, out_, watch_, keep.Value(), core, false);
            watch_ = nullptr;
            return obj;
        }
    };

    void Dispatch(Napi::Env env, TakeCall *call)
    {
        if (call->opts.watch_id != 0)
            call->watch_ = new Watch{core_, call->opts.watch_id};
        call->opts.Bind(call->watch_);
        if (call->opts.o.wait_ms == 0) {
            call->Queue(env);
        } else if (!call->Spawn(env, core_)) {
            call->Fail(env, DLOCK_ENOMEM, "cannot start a thread for the wait");
            delete call;
        }
    }

    // An acquisition through async.h, settled by Acquired.
    struct AsyncTake {
        Napi::Promise::Deferred deferred;
        Napi::ObjectReference keep;  // the client's object, until Acquired
        Core *core;
        std::string name;
        Options opts;
        Watch *watch = nullptr;  // the Lock's once it holds
        AsyncTake(Napi::Env env, Client *c)
            : deferred(Napi::Promise::Deferred::New(env)), keep(Napi::Persistent(c->Value())),
              core(c->core_)
        {
        }
        ~AsyncTake() { delete watch; }
    };

    // Called by dlock_async_process (or by dlock_client_free, from Free),
    // on the JavaScript thread.
    static void Acquired(int rc, dlock_lock *lock, void *arg)
    {
        AsyncTake *t = static_cast<AsyncTake *>(arg);
        std::string message = rc != DLOCK_OK ? dlock_error_message() : "";
        Core *core = t->core;
        JsScope js(core);  // in a pass; from Free, JavaScript's scope
        Napi::Env env(core->env);
        core->inflight--;
        if (rc == DLOCK_OK) {
            Addon *addon = env.GetInstanceData<Addon>();
            Napi::Object obj = addon->lock_ctor.New({});
            if (env.IsExceptionPending()) {
                // Cannot happen short of memory: give it back.
                Napi::Error e = env.GetAndClearPendingException();
                dlock_release(lock);
                t->deferred.Reject(e.Value());
            } else {
                Lock::Unwrap(obj)->Adopt(env, lock, t->watch, t->keep.Value(), core, true);
                t->watch = nullptr;
                t->deferred.Resolve(obj);
            }
        } else {
            t->deferred.Reject(MakeError(env, rc, message));
        }
        core->Drop(env);
        delete t;
    }

    // acquire(name, ttl, wait, autoRenew, watchId, kind, owner, reentrant, permits, label):
    // on Node's loop, through async.h.
    Napi::Value Acquire(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        if (!Ready(env))
            return env.Undefined();
        AsyncTake *t = new AsyncTake(env, this);
        if (!Text(env, info[0], "name", &t->name) || !t->opts.Parse(env, info, 1)) {
            delete t;
            return env.Undefined();
        }
        Napi::Promise p = t->deferred.Promise();
        std::string message;
        int rc = core_->Attach(&message);
        if (rc == DLOCK_OK) {
            if (t->opts.watch_id != 0)
                t->watch = new Watch{core_, t->opts.watch_id};
            t->opts.Bind(t->watch, true);
            rc = dlock_acquire_async(nullptr, core_->c, t->name.c_str(), &t->opts.o, Acquired, t);
            if (rc != DLOCK_OK)
                message = dlock_error_message();
        }
        if (rc != DLOCK_OK) {
            t->deferred.Reject(MakeError(env, rc, message));
            delete t;
            return p;
        }
        core_->inflight++;
        core_->Hold(env);
        return p;
    }

    // acquireMulti(names[], ttl, wait, autoRenew, watchId, kind, owner, reentrant, permits, label)
    Napi::Value AcquireMulti(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct MultiCall : TakeCall {
            std::vector<std::string> names;
            MultiCall(Napi::Env env, Client *c) : TakeCall(env, c) {}
            int Run() override
            {
                std::vector<const char *> p;
                for (const std::string &n : names)
                    p.push_back(n.c_str());
                return dlock_acquire_multi(&out_, core->c, p.empty() ? nullptr : p.data(),
                                           p.size(), &opts.o);
            }
        };
        if (!Ready(env))
            return env.Undefined();
        if (!info[0].IsArray())
            return Throw(env, DLOCK_EINVAL, "names must be an array of names");
        MultiCall *call = new MultiCall(env, this);
        Napi::Array a = info[0].As<Napi::Array>();
        for (uint32_t i = 0; i < a.Length(); i++) {
            std::string n;
            if (!Text(env, a.Get(i), "each name", &n)) {
                delete call;
                return env.Undefined();
            }
            call->names.push_back(n);
        }
        if (!call->opts.Parse(env, info, 1)) {
            delete call;
            return env.Undefined();
        }
        Napi::Promise p = call->Promise();
        Dispatch(env, call);
        return p;
    }

    // campaign(name, identity, ttl, wait, autoRenew, watchId, kind, owner, reentrant, permits, label)
    Napi::Value Campaign(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct CampaignCall : TakeCall {
            std::string identity;
            CampaignCall(Napi::Env env, Client *c) : TakeCall(env, c) {}
            int Run() override
            {
                return dlock_campaign(&out_, core->c, name.c_str(), identity.c_str(), &opts.o);
            }
        };
        if (!Ready(env))
            return env.Undefined();
        CampaignCall *call = new CampaignCall(env, this);
        if (!Text(env, info[0], "name", &call->name) ||
            !Text(env, info[1], "identity", &call->identity) || !call->opts.Parse(env, info, 2)) {
            delete call;
            return env.Undefined();
        }
        Napi::Promise p = call->Promise();
        Dispatch(env, call);
        return p;
    }

    Napi::Value Leader(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct LeaderCall : ClientCall {
            dlock_leader_info out;
            LeaderCall(Napi::Env env, Client *c) : ClientCall(env, c) {}
            int Run() override { return dlock_leader(&out, core->c, name.c_str()); }
            Napi::Value Result(Napi::Env env) override
            {
                Napi::Object o = Napi::Object::New(env);
                o.Set("held", Napi::Boolean::New(env, out.held != 0));
                o.Set("fence", Napi::BigInt::New(env, static_cast<uint64_t>(out.fence)));
                o.Set("ttl", out.held ? Napi::Number::New(env, static_cast<double>(out.ttl_ms))
                                      : env.Null());
                o.Set("identity", out.held ? Napi::String::New(env, out.identity).As<Napi::Value>()
                                           : env.Null());
                return o;
            }
        };
        if (!Ready(env))
            return env.Undefined();
        return QueueNamed(info, new LeaderCall(env, this));
    }

    Napi::Value Status(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct StatusCall : ClientCall {
            dlock_lock_info out;
            StatusCall(Napi::Env env, Client *c) : ClientCall(env, c) {}
            int Run() override { return dlock_status(&out, core->c, name.c_str()); }
            Napi::Value Result(Napi::Env env) override
            {
                Napi::Object o = Napi::Object::New(env);
                o.Set("held", Napi::Boolean::New(env, out.held != 0));
                o.Set("fence", Napi::BigInt::New(env, static_cast<uint64_t>(out.fence)));
                o.Set("ttl", out.ttl_ms >= 0 ? Napi::Number::New(env, static_cast<double>(out.ttl_ms))
                                             : env.Null());
                o.Set("holders", Napi::Number::New(env, out.holders));
                o.Set("kind", Napi::Number::New(env, out.kind));
                if (out.has_holder) {
                    o.Set("host", Napi::String::New(env, out.host));
                    o.Set("pid", Napi::Number::New(env, static_cast<double>(out.pid)));
                    o.Set("startMs", Napi::Number::New(env, static_cast<double>(out.start_ms)));
                    o.Set("label", out.label[0] ? Napi::String::New(env, out.label).As<Napi::Value>()
                                                : env.Null());
                } else {
                    o.Set("host", env.Null());
                    o.Set("pid", env.Null());
                    o.Set("startMs", env.Null());
                    o.Set("label", env.Null());
                }
                return o;
            }
        };
        if (!Ready(env))
            return env.Undefined();
        return QueueNamed(info, new StatusCall(env, this));
    }

    Napi::Value SetPermits(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct PermitsCall : ClientCall {
            int permits = 0;
            PermitsCall(Napi::Env env, Client *c) : ClientCall(env, c) {}
            int Run() override
            {
                return dlock_semaphore_set_permits(core->c, name.c_str(), permits);
            }
        };
        if (!Ready(env))
            return env.Undefined();
        PermitsCall *call = new PermitsCall(env, this);
        call->permits = static_cast<int>(Int(info[1]));
        return QueueNamed(info, call);
    }

    // Async-signal-safe in C, so safe from here at any time.
    Napi::Value Interrupt(const Napi::CallbackInfo &info)
    {
        if (core_ != nullptr && core_->c != nullptr && !core_->freed)
            dlock_client_interrupt(core_->c);
        return info.Env().Undefined();
    }

    Napi::Value Backend(const Napi::CallbackInfo &info)
    {
        if (!Ready(info.Env()))
            return info.Env().Undefined();
        return Napi::String::New(info.Env(), dlock_client_backend(core_->c));
    }

    // free(): lib/index.js calls it once no call on the client runs and its
    // locks are released. dlock_client_free joins the watchdog, so it runs
    // on the pool, unless the loop must run it (below); the Core stays
    // until this object goes (a lost message may still be queued).
    Napi::Value Free(const Napi::CallbackInfo &info)
    {
        Napi::Env env = info.Env();
        struct FreeCall : ClientCall {
            FreeCall(Napi::Env env, Client *c) : ClientCall(env, c) {}
            int Run() override
            {
                dlock_client_free(core->c);
                return DLOCK_OK;
            }
            void Finish(Napi::Env) override
            {
                core->c = nullptr;
                core->freed = true;
                core->tsfn.Release();
            }
        };
        if (core_ == nullptr || closing_)
            return Throw(env, DLOCK_EMISUSE, "the client is closed");
        closing_ = true;
        if (core_->c == nullptr) {
            core_->freed = true;
            core_->tsfn.Release();
            Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
            d.Resolve(env.Undefined());
            return d.Promise();
        }
        if (core_->loop != nullptr && (core_->inflight > 0 || core_->in_pass)) {
            // Asynchronous requests in flight (lib/index.js waits for its
            // own, but not for a collected lock's release), or called from
            // inside dlock_async_process (a continuation of a lock call:
            // `await lock.release(); await client.close()`): free here, on
            // the loop's thread, where their callbacks must run (waits get
            // DLOCK_ECANCELED); from inside dlock_async_process, libdlock
            // frees the client when that returns. About a millisecond on
            // a local Redis or etcd. The detach hook closes the handles.
            dlock_client_free(core_->c);
            core_->c = nullptr;
            core_->freed = true;
            core_->tsfn.Release();
            Napi::Promise::Deferred d = Napi::Promise::Deferred::New(env);
            d.Resolve(env.Undefined());
            return d.Promise();
        }
        // Nothing due on the loop: stop watching now, and free on the pool
        // (dlock_client_free joins the client's threads).
        if (core_->loop != nullptr) {
            dlock_async_set_detach(core_->c, nullptr, nullptr);
            LoopClose(core_->loop);
        }
        FreeCall *call = new FreeCall(env, this);
        Napi::Promise p = call->Promise();
        call->Queue(env);
        return p;
    }

    Core *core_ = nullptr;
    bool closing_ = false;
};

Napi::Value Setup(const Napi::CallbackInfo &info)
{
    Addon *addon = info.Env().GetInstanceData<Addon>();
    if (info[0].IsFunction())
        addon->make_error = Napi::Persistent(info[0].As<Napi::Function>());
    return info.Env().Undefined();
}

Napi::Value Version(const Napi::CallbackInfo &info)
{
    return Napi::String::New(info.Env(), dlock_version());
}

// The bytes malloc has handed out and not had back, in every arena: what
// the memory test watches (the RSS also counts the arenas' free space).
Napi::Value MallocInUse(const Napi::CallbackInfo &info)
{
    struct mallinfo2 mi = mallinfo2();
    return Napi::Number::New(info.Env(), static_cast<double>(mi.uordblks + mi.hblkhd));
}

Napi::Value Strerror(const Napi::CallbackInfo &info)
{
    return Napi::String::New(info.Env(), dlock_strerror(static_cast<int>(Int(info[0]))));
}

// Node loads an addon with RTLD_LOCAL, and libdlock with it, where the
// backend modules libdlock loads by scheme (zk.so, postgres.so, mysql.so)
// cannot see its calls: make libdlock's symbols global, as a program
// linked with it has them.
void PromoteLibdlock()
{
    Dl_info info;
    if (dladdr(reinterpret_cast<void *>(&dlock_version), &info) == 0 || info.dli_fname == nullptr)
        return;
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    // Dropping the extra reference leaves the library loaded, and global.
    if (h != nullptr)
        dlclose(h);
}

Napi::Object Init(Napi::Env env, Napi::Object exports)
{
    PromoteLibdlock();
    Addon *addon = new Addon;
    env.SetInstanceData<Addon>(addon);
    Napi::Function lock = Lock::Define(env);
    addon->lock_ctor = Napi::Persistent(lock);
    exports.Set("Lock", lock);
    exports.Set("Client", Client::Define(env));
    exports.Set("setup", Napi::Function::New<Setup>(env));
    exports.Set("version", Napi::Function::New<Version>(env));
    exports.Set("strerror", Napi::Function::New<Strerror>(env));
    exports.Set("mallocInUse", Napi::Function::New<MallocInUse>(env));
    return exports;
}

}  // namespace

NODE_API_MODULE(dlock, Init)
