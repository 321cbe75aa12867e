// Audio in the browser: one AudioContext for both directions, a microphone that yields PCM16 frames at
// 16 kHz, and a player that schedules reply chunks back to back and can drop everything queued at once.

export const INPUT_RATE = 16000;
export const FRAME_SAMPLES = 320; // 20 ms at 16 kHz

let sharedContext = null;

/** The page's AudioContext, made at load: with an autoplay policy that allows it, it runs at once;
 * otherwise it is resumed by the first click (Start talking). Its rate is whatever the device offers. */
export function audioContext() {
  if (!sharedContext) {
    const Ctx = window.AudioContext || window.webkitAudioContext;
    sharedContext = new Ctx({ latencyHint: "interactive" });
  }
  return sharedContext;
}

export class Microphone {
  /**
   * @param {AudioContext} ctx
   * @param {{raw?: boolean, onFrame: (pcm: ArrayBuffer, level: {rms: number, peak: number}) => void}} opts
   */
  constructor(ctx, opts) {
    this.ctx = ctx;
    this.raw = !!opts.raw;
    this.onFrame = opts.onFrame;
    this.stream = null;
    this.source = null;
    this.node = null;
    this.sink = null;
    this.moduleLoaded = false;
  }

  get active() {
    return this.stream !== null;
  }

  async start() {
    if (this.stream) return;
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This browser offers no microphone here (a secure page, https or localhost, is needed).");
    }
    const processing = !this.raw; // echo cancellation etc. help people; tests compare raw signals
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: {
        channelCount: 1,
        echoCancellation: processing,
        noiseSuppression: processing,
        autoGainControl: processing,
      },
      video: false,
    });
    try {
      if (this.ctx.state !== "running") await this.ctx.resume();
      if (!this.moduleLoaded) {
        await this.ctx.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
        this.moduleLoaded = true;
      }
      this.source = this.ctx.createMediaStreamSource(stream);
      this.node = new AudioWorkletNode(this.ctx, "mic-capture", {
        numberOfInputs: 1,
        numberOfOutputs: 1,
        outputChannelCount: [1],
        processorOptions: { targetRate: INPUT_RATE, frameSamples: FRAME_SAMPLES },
      });
      this.node.port.onmessage = (e) => this.onFrame(e.data.pcm, { rms: e.data.rms, peak: e.data.peak });
      // The node must be pulled by the graph to run; a silent gain keeps it pulled without an echo.
      this.sink = this.ctx.createGain();
      this.sink.gain.value = 0;
      this.source.connect(this.node);
      this.node.connect(this.sink);
      this.sink.connect(this.ctx.destination);
      this.stream = stream;
    } catch (err) {
      stream.getTracks().forEach((t) => t.stop());
      throw err;
    }
  }

  stop() {
    if (!this.stream) return;
    this.node.port.postMessage({ enabled: false });
    this.node.port.onmessage = null;
    this.source.disconnect();
    this.node.disconnect();
    this.sink.disconnect();
    this.stream.getTracks().forEach((t) => t.stop());
    this.stream = this.source = this.node = this.sink = null;
  }
}

/** Gap-free playback of PCM16 chunks: each chunk starts where the previous one ends, or a short lead
 * after now when the queue has run dry. */
export class Player {
  constructor(ctx, { lead = 0.06 } = {}) {
    this.ctx = ctx;
    this.lead = lead;
    this.nextTime = 0;
    this.sources = new Set();
    this.out = ctx.createGain();
    this.out.connect(ctx.destination);
    this.scheduledSeconds = 0; // total ever scheduled
    this.chunks = 0;
    this.gaps = 0; // chunks that found the queue already empty in the middle of a reply
  }

  /** Seconds of reply audio queued ahead of the playhead. */
  get buffered() {
    return Math.max(0, this.nextTime - this.ctx.currentTime);
  }

  get playing() {
    return this.sources.size > 0;
  }

  /**
   * @param {ArrayBuffer} data PCM16 little-endian mono
   * @param {number} rate its sample rate
   * @param {boolean} continuing whether it continues a reply already playing (for counting gaps)
   */
  enqueue(data, rate, continuing) {
    const n = data.byteLength >> 1;
    if (n === 0) return 0;
    const view = new DataView(data, 0, n * 2);
    const buffer = this.ctx.createBuffer(1, n, rate);
    const ch = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) ch[i] = view.getInt16(i * 2, true) / 32768;
    const now = this.ctx.currentTime;
    if (this.nextTime < now + 0.005) {
      if (continuing && this.chunks > 0) this.gaps++;
      this.nextTime = now + this.lead;
    }
    const src = this.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(this.out);
    src.onended = () => this.sources.delete(src);
    src.start(this.nextTime);
    this.sources.add(src);
    this.nextTime += buffer.duration;
    this.scheduledSeconds += buffer.duration;
    this.chunks++;
    return buffer.duration;
  }

  /** Drop everything queued or playing, now (barge-in). */
  clear() {
    for (const src of this.sources) {
      src.onended = null;
      try {
        src.stop();
      } catch {
        /* never started */
      }
      src.disconnect();
    }
    this.sources.clear();
    this.nextTime = 0;
  }
}
