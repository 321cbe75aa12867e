// Microphone capture on the audio thread: mono mix, band-limited resampling from the context's rate
// (44.1 kHz with no sound card, 48 kHz on most laptops; never assumed) to 16 kHz, and PCM16 frames of
// `frameSamples` samples (20 ms by default) posted to the page with their level.
//
// The resampler evaluates a Hann-windowed sinc at each output instant. Its cutoff sits just under the
// output Nyquist frequency, so it is the anti-aliasing filter and the interpolator at once.

const ZERO_CROSSINGS = 8; // per side of the kernel; 8 gives > 60 dB stop band, ample for speech

class MicCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.outRate = opts.targetRate || 16000;
    this.frameSamples = opts.frameSamples || 320;
    this.step = sampleRate / this.outRate; // input samples per output sample
    this.passthrough = Math.abs(this.step - 1) < 1e-9;
    // Cutoff as a fraction of the input Nyquist frequency.
    this.fc = Math.min(1, this.outRate / sampleRate) * 0.92;
    this.half = Math.ceil(ZERO_CROSSINGS / this.fc);
    this.buf = new Float32Array(4096);
    this.len = 0; // valid samples in buf
    this.base = 0; // absolute index of buf[0]
    this.pos = 0; // absolute (fractional) input position of the next output sample
    this.frame = new Int16Array(this.frameSamples);
    this.fill = 0;
    this.sumSq = 0;
    this.peak = 0;
    this.enabled = true;
    this.port.onmessage = (e) => {
      if (e.data && typeof e.data.enabled === "boolean") this.enabled = e.data.enabled;
    };
  }

  append(x) {
    if (this.len + x.length > this.buf.length) {
      const bigger = new Float32Array(Math.max(this.buf.length * 2, this.len + x.length));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(x, this.len);
    this.len += x.length;
  }

  emit(v) {
    const s = v > 1 ? 1 : v < -1 ? -1 : v;
    this.frame[this.fill++] = s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
    this.sumSq += s * s;
    const a = Math.abs(s);
    if (a > this.peak) this.peak = a;
    if (this.fill === this.frameSamples) {
      const pcm = this.frame.buffer;
      const rms = Math.sqrt(this.sumSq / this.frameSamples);
      this.port.postMessage({ pcm, rms, peak: this.peak }, [pcm]);
      this.frame = new Int16Array(this.frameSamples);
      this.fill = 0;
      this.sumSq = 0;
      this.peak = 0;
    }
  }

  resample() {
    const { fc, half, buf, base } = this;
    const end = base + this.len;
    while (this.pos + half < end) {
      const center = this.pos - base;
      const i0 = Math.max(0, Math.ceil(center - half));
      const i1 = Math.min(this.len - 1, Math.floor(center + half));
      let acc = 0;
      let norm = 0;
      for (let i = i0; i <= i1; i++) {
        const x = i - center;
        const u = fc * x;
        const sinc = u === 0 ? 1 : Math.sin(Math.PI * u) / (Math.PI * u);
        const w = 0.5 + 0.5 * Math.cos((Math.PI * x) / (half + 1));
        const h = sinc * w;
        acc += buf[i] * h;
        norm += h;
      }
      this.emit(norm > 0 ? acc / norm : 0);
      this.pos += this.step;
    }
    // Keep only what the next outputs still need.
    const keepFrom = Math.max(0, Math.floor(this.pos - half) - 1 - base);
    if (keepFrom > 0) {
      buf.copyWithin(0, keepFrom, this.len);
      this.len -= keepFrom;
      this.base += keepFrom;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0 || !this.enabled) return true;
    const n = input[0].length;
    let mono = input[0];
    if (input.length > 1) {
      mono = new Float32Array(n);
      for (const ch of input) for (let i = 0; i < n; i++) mono[i] += ch[i];
      for (let i = 0; i < n; i++) mono[i] /= input.length;
    }
    if (this.passthrough) {
      for (let i = 0; i < n; i++) this.emit(mono[i]);
    } else {
      this.append(mono);
      this.resample();
    }
    return true;
  }
}

registerProcessor("mic-capture", MicCapture);
