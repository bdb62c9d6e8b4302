// A second host of the WASTE control component, in JavaScript: jco turns
// the component into a JS module, this file implements the `model` imports
// of wit/engine.wit over a stub model, calls the `control` exports and
// prints what they returned as one JSON line. The Rust side
// (tests/integration/jco.rs) checks the answers against the Rust host and
// the stub's own rule, so nothing here decides whether the contract holds.
//
// Usage: node host.mjs SPEC.json
// SPEC: { component, out_dir, tokenizer_dir, vocab_size, context, bos, eos,
//         text, prompt_ids, max_tokens, top_logprobs, messages }

import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import * as cli from '@bytecodealliance/preview2-shim/cli';
import * as clocks from '@bytecodealliance/preview2-shim/clocks';
import * as io from '@bytecodealliance/preview2-shim/io';
import * as random from '@bytecodealliance/preview2-shim/random';

const here = dirname(fileURLToPath(import.meta.url));
const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'));

// jco's own CLI turns the component into engine.js + core modules.
const jco = join(here, 'node_modules/@bytecodealliance/jco/dist/jco.js');
execFileSync(process.execPath, [
  jco, 'transpile', spec.component, '-o', spec.out_dir,
  '--name', 'engine', '--instantiation', 'sync', '--quiet',
], { stdio: ['ignore', 'ignore', 'inherit'] });
const { instantiate } = await import(pathToFileURL(join(spec.out_dir, 'engine.js')).href);

// The stub model: the next token after a state of `position` tokens is
// next(position); its logit is HIGH, every other logit 0. The rule is
// repeated in tests/integration/jco.rs, which checks the generated ids.
const HIGH = 10;
const next = (position) => (position * 37 + 11) % spec.vocab_size;

const state = { position: 0, tokens: [], held: null, evaluateCalls: 0, failEvaluate: false };
const events = [];
let cancelAfter = Infinity;

function zeroStats() {
  // direct-io is a later field of step-stats; an older contract ignores it.
  return { expertsReused: 0, expertsPrefetched: 0, expertsMissed: 0, bytesRead: 0n, msTotal: 0, msIo: 0, directIo: false };
}

// The host chooses the chat template (wit: `chat-template`): this stub
// has one, the tokenizer fixture's own, and none for conversations with
// tools, so that refusal is seen crossing the boundary.
function ownTemplate() {
  const config = JSON.parse(readFileSync(join(spec.tokenizer_dir, 'tokenizer_config.json'), 'utf8'));
  return config.chat_template;
}

const model = {
  info() {
    return {
      family: 'stub',
      vocabSize: spec.vocab_size,
      contextLength: spec.context,
      bosToken: spec.bos ?? undefined,
      eosTokens: new Uint32Array(spec.eos),
    };
  },
  tokenizerFiles() {
    return readdirSync(spec.tokenizer_dir)
      .filter((f) => ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
        'chat_template.jinja', 'tiktoken.model'].includes(f))
      .map((f) => [f, new Uint8Array(readFileSync(join(spec.tokenizer_dir, f)))]);
  },
  chatTemplate(withTools) {
    if (withTools) throw { payload: 'stub: no template for conversations with tools' };
    return ownTemplate();
  },
  evaluate(tokens) {
    state.evaluateCalls += 1;
    if (state.failEvaluate) throw { payload: 'stub: evaluate refused on purpose' };
    const all = state.held === null ? [...tokens] : [state.held, ...tokens];
    state.held = null;
    if (all.length === 0) throw { payload: 'stub: nothing to evaluate' };
    if (state.position + all.length > spec.context) throw { payload: 'stub: context full' };
    state.tokens.push(...all);
    state.position += all.length;
    const logits = new Float32Array(spec.vocab_size);
    logits[next(state.position)] = HIGH;
    return { logits, position: state.position, stats: zeroStats() };
  },
  recentTokens(n) {
    const seq = state.held === null ? state.tokens : [...state.tokens, state.held];
    return new Uint32Array(seq.slice(Math.max(0, seq.length - n)));
  },
  sampleWithPlugin(_logits, _recent) {
    throw { payload: 'this host attaches no sampler plugin' };
  },
  emitToken(event) {
    events.push({
      token: event.token,
      text: event.text,
      logprob: event.logprob,
      top: event.topLogprobs.map((t) => [t.token, t.logprob]),
    });
    return events.length < cancelAfter;
  },
};

const wasi = {
  'wasi:cli/environment': cli.environment,
  'wasi:cli/exit': cli.exit,
  'wasi:cli/stderr': cli.stderr,
  'wasi:cli/stdin': cli.stdin,
  'wasi:cli/stdout': cli.stdout,
  'wasi:cli/terminal-input': cli.terminalInput,
  'wasi:cli/terminal-output': cli.terminalOutput,
  'wasi:cli/terminal-stderr': cli.terminalStderr,
  'wasi:cli/terminal-stdin': cli.terminalStdin,
  'wasi:cli/terminal-stdout': cli.terminalStdout,
  'wasi:clocks/monotonic-clock': clocks.monotonicClock,
  'wasi:clocks/wall-clock': clocks.wallClock,
  'wasi:io/error': io.error,
  'wasi:io/poll': io.poll,
  'wasi:io/streams': io.streams,
  'wasi:random/insecure-seed': random.insecureSeed,
  // llguidance's hash maps seed themselves from it.
  'wasi:random/random': random.random,
  'waste:engine/model': model,
};
// The generated code asks for unversioned names in some releases and
// versioned ones in others; give both.
const imports = {};
for (const [k, v] of Object.entries(wasi)) {
  imports[k] = v;
  imports[`${k}@${k.startsWith('waste:') ? spec.wit_version : '0.2.6'}`] = v;
}
const getCoreModule = (path) => new WebAssembly.Module(readFileSync(join(spec.out_dir, path)));
const { control } = instantiate(getCoreModule, imports);

// A thrown `result` error arrives as an Error whose `payload` is the value.
function attempt(f) {
  try {
    return { ok: f() };
  } catch (e) {
    return { err: e && 'payload' in e ? e.payload : String(e) };
  }
}

const params = (over) => ({
  temperature: 0, topK: 0, topP: 1, minP: 0, repetitionPenalty: 1,
  presencePenalty: 0, frequencyPenalty: 0, penaltyLastN: 0, logitBias: [],
  topLogprobs: spec.top_logprobs, seed: 0n, maxTokens: spec.max_tokens,
  stopAtEos: false, stopStrings: [], stopTokens: new Uint32Array(), plugin: false,
  constraint: undefined,
  ...over,
});

const out = {};
out.tokenize = Array.from(control.tokenize(spec.text));
out.tokenize_markup = Array.from(control.tokenizeMarkup(spec.text));
out.detokenize = control.detokenize(new Uint32Array(out.tokenize));
out.detokenize_prompt = control.detokenize(new Uint32Array(spec.prompt_ids));
const messages = spec.messages.map((m) => ({ role: m.role, content: m.content, media: [] }));
out.chat_ids = Array.from(control.applyChatTemplate(messages, undefined, true, undefined));
out.chat_text = control.renderChatTemplate(messages, undefined, true, undefined);
// Template variables cross the JS boundary as JSON text: a reserved name
// must come back as the guest's refusal of an argument.
out.chat_vars = attempt(() => control.renderChatTemplate(messages, undefined, true, '{"messages": []}'));
// The host's refusal to choose a template comes back as a chat-template error.
out.no_template = attempt(() => control.renderChatTemplate(messages, '[]', true, undefined));

const prompt = new Uint32Array(spec.prompt_ids);
const done = control.generate(prompt, params({}));
out.generate = {
  tokens: Array.from(done.tokens),
  text: done.text,
  stop_reason: done.stopReason,
  logprobs: done.logprobs.map((l) => [l.logprob, l.top.map((t) => [t.token, t.logprob])]),
  events: events.slice(),
  position_after: state.position,
  held_after: state.held,
};
// The contract: the last sampled token is held by the host, not evaluated.
state.held = done.tokens[done.tokens.length - 1];

// A second turn continues from the held token; emit-token's false cancels.
events.length = 0;
cancelAfter = 2;
const turn2 = control.generate(new Uint32Array(), params({ maxTokens: 5 }));
out.cancelled = { tokens: Array.from(turn2.tokens), stop_reason: turn2.stopReason, position_after: state.position };
cancelAfter = Infinity;

// Error paths: an out-of-range parameter, then a failing host import.
out.bad_param = attempt(() => control.generate(prompt, params({ topP: 5 })));
state.failEvaluate = true;
out.host_failure = attempt(() => control.generate(prompt, params({})));
state.failEvaluate = false;

process.stdout.write(JSON.stringify(out) + '\n');
