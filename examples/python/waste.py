"""A small ctypes binding of libwaste (ffi/include/waste.h)."""

import ctypes as C
import json
import os

OK, CANCELLED, BUFFER_TOO_SMALL = 0, 6, 12


class WasteError(Exception):
    def __init__(self, code, detail):
        kind = _lib.waste_strerror(code).decode()
        # The context's last error usually starts with the same kind already.
        super().__init__(detail if detail.startswith(kind) else f"{kind}: {detail}")
        self.code = code


class OpenOptions(C.Structure):
    _fields_ = [("context", C.c_size_t), ("budget", C.c_uint64), ("threads", C.c_size_t),
                ("cpus", C.POINTER(C.c_uint32)), ("n_cpus", C.c_size_t), ("cache", C.c_bool),
                ("cache_policy", C.c_uint32), ("readers", C.c_size_t), ("read_ahead", C.c_bool),
                ("direct_io", C.c_bool), ("lookahead", C.c_size_t), ("preload", C.c_bool),
                ("verify", C.c_uint32), ("kv_type", C.c_uint32)]


class MemoryPlan(C.Structure):
    _fields_ = [("context", C.c_size_t)] + [(n, C.c_uint64) for n in (
        "trunk", "state", "scratch", "record_bytes", "min_cache", "floor", "working_set",
        "recommended", "all_experts", "usable_ram", "budget")] + [
        ("cache_slots", C.c_size_t), ("cache_bytes", C.c_uint64), ("total", C.c_uint64)]


class Str(C.Structure):
    _fields_ = [("ptr", C.c_char_p), ("len", C.c_size_t)]


class GenerateParams(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_uint32), ("top_p", C.c_float),
                ("min_p", C.c_float), ("repetition_penalty", C.c_float),
                ("presence_penalty", C.c_float), ("frequency_penalty", C.c_float),
                ("penalty_last_n", C.c_uint32), ("seed", C.c_uint64), ("max_tokens", C.c_uint32),
                ("stop_at_eos", C.c_bool), ("stop_tokens", C.POINTER(C.c_uint32)),
                ("n_stop_tokens", C.c_size_t), ("stop_strings", C.POINTER(Str)),
                ("n_stop_strings", C.c_size_t), ("logit_bias_tokens", C.POINTER(C.c_uint32)),
                ("logit_bias_values", C.POINTER(C.c_float)), ("n_logit_bias", C.c_size_t),
                ("top_logprobs", C.c_uint32), ("constraint_kind", C.c_uint32), ("constraint", Str)]


# waste_constraint_kind: what a structured output follows.
CONSTRAINT_KINDS = {"json_object": 1, "json_schema": 2, "lark": 3, "gbnf": 4, "regex": 5}


class TopLogprob(C.Structure):
    _fields_ = [("token", C.c_uint32), ("logprob", C.c_float)]


class TokenEvent(C.Structure):
    _fields_ = [("token", C.c_uint32), ("text", C.POINTER(C.c_char)), ("text_len", C.c_size_t),
                ("logprob", C.c_float), ("experts_reused", C.c_uint32),
                ("experts_prefetched", C.c_uint32), ("experts_missed", C.c_uint32),
                ("bytes_read", C.c_uint64), ("ms_total", C.c_float), ("ms_io", C.c_float),
                ("top", C.POINTER(TopLogprob)), ("n_top", C.c_size_t), ("direct_io", C.c_bool)]

    def alternatives(self):
        """The top-logprobs of this step as (token, logprob), most likely first."""
        return [(self.top[i].token, self.top[i].logprob) for i in range(self.n_top)]


class ChatMessage(C.Structure):
    _fields_ = [("role", Str), ("content", Str), ("extra", Str), ("media", C.POINTER(Str)), ("n_media", C.c_size_t)]


class ImageInfo(C.Structure):
    _fields_ = [("width", C.c_size_t), ("height", C.c_size_t), ("tokens", C.c_size_t)]


class SamplerOption(C.Structure):
    _fields_ = [("name", Str), ("value", C.c_float)]


class Completion(C.Structure):
    _fields_ = [("n_tokens", C.c_size_t), ("stop_reason", C.c_int)]


CALLBACK = C.CFUNCTYPE(C.c_bool, C.c_void_p, C.POINTER(TokenEvent))

try:
    _lib = C.CDLL(os.environ.get("WASTE_LIB", "libwaste.so"))
except OSError as e:
    raise OSError(
        f"cannot load the WASTE C library ({e}); set WASTE_LIB to the libwaste.so that "
        "`cargo build --release -p waste-ffi` writes under $CARGO_TARGET_DIR/release (default target/release)"
    ) from e
_lib.waste_strerror.restype = C.c_char_p
_lib.waste_version.restype = C.c_char_p
_lib.waste_ctx_last_error.restype = C.c_size_t


class Engine:
    def __init__(self):
        self._ctx = C.c_void_p()
        r = _lib.waste_ctx_open(C.byref(self._ctx))
        if r != OK:
            raise WasteError(r, "opening a context")

    def _check(self, r, allow=()):
        if r != OK and r not in allow:
            buf = C.create_string_buffer(1024)
            _lib.waste_ctx_last_error(self._ctx, buf, 1024)
            raise WasteError(r, buf.value.decode())
        return r

    def plan(self, path, context=0, budget=0):
        p, plan = path.encode(), MemoryPlan()
        self._check(_lib.waste_plan(self._ctx, p, C.c_size_t(len(p)), C.c_size_t(context),
                                    C.c_uint64(budget), C.byref(plan)))
        return plan

    def open(self, path, budget=0):
        opts = OpenOptions()
        _lib.waste_open_options_default(C.byref(opts))
        opts.budget = budget
        p, model = path.encode(), C.c_void_p()
        self._check(_lib.waste_model_open(self._ctx, p, C.c_size_t(len(p)), C.byref(opts), C.byref(model)))
        return model

    def session(self, model):
        return Session(self, model)

    def close_model(self, model):
        _lib.waste_model_close(model)

    def close(self):
        _lib.waste_ctx_close(self._ctx)


class Session:
    def __init__(self, engine, model):
        self.e, self._s = engine, C.c_void_p()
        engine._check(_lib.waste_session_open(engine._ctx, model, C.byref(self._s)))

    def tokenize(self, text):
        t, n = text.encode(), C.c_size_t()
        buf = (C.c_uint32 * (len(t) + 8))()
        self.e._check(_lib.waste_session_tokenize(self._s, t, C.c_size_t(len(t)), buf,
                                                  C.c_size_t(len(buf)), C.byref(n)))
        return list(buf[:n.value])

    def generate(self, prompt, on_token, max_tokens=16, temperature=0.0, top_logprobs=0, seed=0, constraint=None):
        """`constraint`: None, "json_object", or (kind, text) with kind one of
        CONSTRAINT_KINDS (e.g. ("json_schema", json.dumps(schema)))."""
        params = GenerateParams()
        _lib.waste_generate_params_default(C.byref(params))
        params.max_tokens, params.temperature = max_tokens, temperature
        params.top_logprobs, params.seed = top_logprobs, seed
        if constraint is not None:
            kind, text = (constraint, "") if isinstance(constraint, str) else constraint
            text = text.encode()
            params.constraint_kind = CONSTRAINT_KINDS[kind]
            params.constraint = Str(text, len(text))
        ids = (C.c_uint32 * len(prompt))(*prompt)
        cb = CALLBACK(lambda _user, ev: bool(on_token(ev.contents)))
        done = Completion()
        self.e._check(_lib.waste_session_generate(self._s, ids, C.c_size_t(len(prompt)), C.byref(params),
                                                  cb, None, C.byref(done)), allow=(CANCELLED,))
        return done

    @staticmethod
    def _messages(messages):
        def s(text):
            b = None if text is None else text.encode()
            return Str(b, 0 if b is None else len(b))
        def media(m):
            items = m.get("media") or []
            return (Str * max(len(items), 1))(*[s(t) for t in items]), len(items)
        kept = [media(m) for m in messages]   # the arrays must outlive the call
        arr = (ChatMessage * len(messages))(
            *[ChatMessage(s(m["role"]), s(m.get("content")), s(m.get("extra")), a, n)
              for m, (a, n) in zip(messages, kept)])
        arr._media = kept
        return arr, Str(None, 0)

    @staticmethod
    def _vars(template_vars):
        if template_vars is None:
            return Str(None, 0)
        b = json.dumps(template_vars).encode()
        return Str(b, len(b))

    def render_chat_template(self, messages, add_generation_prompt=True, template_vars=None):
        """The conversation through the model's chat template, as text.

        `template_vars` (a dict, e.g. {"enable_thinking": False}) are the
        template's further variables, as apply_chat_template's keyword
        arguments in transformers."""
        arr, tools = self._messages(messages)
        n = C.c_size_t()
        args = (self._s, arr, C.c_size_t(len(messages)), tools, C.c_bool(add_generation_prompt),
                self._vars(template_vars))
        # Ask for the length first, then fill a buffer of that size.
        self.e._check(_lib.waste_session_render_chat_template_vars(*args, None, C.c_size_t(0), C.byref(n)),
                      allow=(BUFFER_TOO_SMALL,))
        buf = C.create_string_buffer(n.value)
        self.e._check(_lib.waste_session_render_chat_template_vars(*args, buf, C.c_size_t(n.value),
                                                                   C.byref(n)))
        return buf.raw[:n.value].decode()

    def apply_chat_template(self, messages, add_generation_prompt=True, template_vars=None):
        """The conversation through the model's chat template, as prompt tokens
        (`template_vars` as in render_chat_template)."""
        arr, tools = self._messages(messages)
        n = C.c_size_t()
        args = (self._s, arr, C.c_size_t(len(messages)), tools, C.c_bool(add_generation_prompt),
                self._vars(template_vars))
        self.e._check(_lib.waste_session_apply_chat_template_vars(*args, None, C.c_size_t(0), C.byref(n)),
                      allow=(BUFFER_TOO_SMALL,))
        buf = (C.c_uint32 * max(n.value, 1))()
        self.e._check(_lib.waste_session_apply_chat_template_vars(*args, buf, C.c_size_t(n.value),
                                                                  C.byref(n)))
        return list(buf[:n.value])

    def attach_image(self, image):
        """Runs an image (a file path or its bytes: PNG, JPEG, WebP, GIF)
        through the model's vision tower and attaches it for the next prompt.
        Returns its width, height, prompt positions and `markup`: put the
        markup in a chat message's "media" list, or tokenize it as markup."""
        data = image if isinstance(image, (bytes, bytearray)) else open(image, "rb").read()
        info, n = ImageInfo(), C.c_size_t()
        buf = C.create_string_buffer(128)   # WASTE_IMAGE_MARKUP_MAX
        self.e._check(_lib.waste_session_attach_image(self._s, data, C.c_size_t(len(data)), C.byref(info),
                                                      buf, C.c_size_t(128), C.byref(n)))
        return {"width": info.width, "height": info.height, "tokens": info.tokens,
                "markup": buf.raw[:n.value].decode()}

    def set_sampler(self, path, **options):
        """Routes every draw to the sampler plugin component at `path`."""
        p = path.encode()
        names = [k.encode() for k in options]
        opts = (SamplerOption * max(len(names), 1))(
            *[SamplerOption(Str(k, len(k)), float(v)) for k, v in zip(names, options.values())])
        self.e._check(_lib.waste_session_set_sampler(self._s, p, C.c_size_t(len(p)), opts,
                                                     C.c_size_t(len(names)), None))

    def clear_sampler(self):
        self.e._check(_lib.waste_session_clear_sampler(self._s))

    def position(self):
        n = C.c_size_t()
        self.e._check(_lib.waste_session_position(self._s, C.byref(n)))
        return n.value

    def save_state(self, path):
        p = path.encode()
        self.e._check(_lib.waste_session_save_state(self._s, p, C.c_size_t(len(p))))

    def load_state(self, path):
        p = path.encode()
        self.e._check(_lib.waste_session_load_state(self._s, p, C.c_size_t(len(p))))

    def reset(self):
        self.e._check(_lib.waste_session_reset(self._s))

    def close(self):
        _lib.waste_session_close(self._s)


def version():
    return _lib.waste_version().decode()
