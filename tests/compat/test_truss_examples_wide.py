"""More of basetenlabs/truss-examples served unchanged (tests/data/truss/examples, byte for byte, see
tests/data/truss/SOURCES.md): each example's model.py and config.yaml as published, the heavy libraries they
import (torch, transformers, vllm, whisper, TTS, chatterbox, torchaudio) replaced by tiny stand-ins on the
server's PYTHONPATH (`STAND_INS`), and each sent the request its config's ``example_model_input`` or README
shows, at Truss's paths (``/v1/models/model:predict``, as Truss's clients send it).

The stand-ins are deterministic: a "generation" is the prompt's words in reverse order, a gated Hugging Face
repository (``meta-llama/*``, ``baseten/...gated...``) needs a token that looks like one (``hf_...``), as the
Hub refuses it otherwise, so that a secret that did not reach the model shows. No test reaches the network:
``whisper``'s preprocess fetches its audio from a loopback server.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import stat
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import REPO, free_port
from tests.stand_ins import write

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "truss" / "examples"
TOKEN = "hf_stand_in_token"

STAND_INS = {
    "torch/__init__.py": """
import numpy as np

bfloat16 = "bfloat16"
float16 = "float16"


class Array:
    # A numeric tensor over numpy.
    def __init__(self, data, dtype=np.float32):
        self.array = np.asarray(data, dtype=dtype)

    def to(self, device):
        return self

    def cpu(self):
        return self

    def detach(self):
        return self

    def clone(self):
        return Array(self.array.copy())

    def half(self):
        return Array(self.array, np.float16)

    def squeeze(self):
        return Array(self.array.squeeze())

    def unsqueeze(self, dim):
        return Array(np.expand_dims(self.array, dim))

    def reshape(self, shape):
        return Array(self.array.reshape(shape))

    def numpy(self):
        return self.array

    def tolist(self):
        return self.array.tolist()


def tensor(data):
    return Array(data)


def cat(tensors, dim=0):
    return Array(np.concatenate([t.array for t in tensors], axis=dim))


class Tensor(list):
    # Token pieces (strings) stand for token ids.
    def to(self, device):
        return self


class no_grad:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class cuda:
    @staticmethod
    def is_available():
        return False
""",
    "_gated.py": """
import os


def check(repo, token=None):
    # The Hub refuses a gated repository to a request without a token of its own.
    gated = repo.startswith("meta-llama/") or "gated" in repo
    token = token or os.environ.get("HF_TOKEN")
    if gated and not (isinstance(token, str) and token.startswith("hf_")):
        raise OSError(f"You are trying to access a gated repo: {repo}; pass a valid token")


def reverse(prompt, limit):
    return list(reversed(prompt.split()))[: int(limit)]
""",
    "transformers/__init__.py": """
import queue

from _gated import check, reverse
from torch import Tensor


class GenerationConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class BatchEncoding(dict):
    def __getattr__(self, name):
        return self[name]


class AutoTokenizer:
    eos_token_id = 2
    pad_token_id = 0
    pad_token = None

    @classmethod
    def from_pretrained(cls, repo, use_auth_token=None, token=None, **kwargs):
        check(repo, use_auth_token or token)
        return cls()

    def __call__(self, text, return_tensors=None, **kwargs):
        return BatchEncoding(input_ids=Tensor([text]))

    def decode(self, ids, skip_special_tokens=False):
        return "".join(ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


class Output:
    def __init__(self, sequences):
        self.sequences = sequences


class AutoModelForCausalLM:
    @classmethod
    def from_pretrained(cls, repo, use_auth_token=None, token=None, **kwargs):
        check(repo, use_auth_token or token)
        return cls()

    def generate(self, input_ids, generation_config=None, streamer=None, max_new_tokens=None, **kwargs):
        limit = max_new_tokens or getattr(generation_config, "max_length", None) or 16
        prompt = "".join(input_ids)
        new = [" " + word for word in reverse(prompt, limit)]
        if streamer is not None:
            streamer.put(prompt)
            for piece in new:
                streamer.put(piece)
            streamer.end()
        return Output([Tensor([prompt, *new])])


LlamaForCausalLM = AutoModelForCausalLM
LlamaTokenizer = AutoTokenizer


class TextIteratorStreamer:
    # As transformers' own: the prompt first (no skip_prompt), then the new text, ended by end().
    def __init__(self, tokenizer, skip_prompt=False, **kwargs):
        self._queue = queue.Queue()

    def put(self, text):
        self._queue.put(text)

    def end(self):
        self._queue.put(None)

    def __iter__(self):
        while (text := self._queue.get()) is not None:
            yield text


class _Pipeline:
    def __init__(self, task, model):
        self.task = task
        self.model = model

    def __call__(self, inputs, question=None):
        if self.task == "text-classification":
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            labels = ["NEGATIVE" if "not" in text.split() else "POSITIVE" for text in texts]
            return [{"label": label, "score": 0.75} for label in labels]
        if self.task == "fill-mask":
            return [{"sequence": inputs.replace("[MASK]", "good"), "token_str": "good", "score": 0.5}]
        if self.task == "document-question-answering":
            return [{"answer": inputs.rsplit("/", 1)[-1], "question": question, "score": 0.5}]
        raise KeyError(f"Unknown task {self.task}")


def pipeline(task, model=None, use_auth_token=None, token=None, **kwargs):
    if model is not None:
        check(model, use_auth_token or token)
    return _Pipeline(task, model)
""",
    "vllm/__init__.py": """
class SamplingParams:
    def __init__(self, max_tokens=16, **kwargs):
        self.max_tokens = max_tokens
        self.__dict__.update(kwargs)
""",
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
class AsyncEngineArgs:
    def __init__(self, model, **kwargs):
        self.model = model
        self.__dict__.update(kwargs)
""",
    "vllm/engine/async_llm_engine.py": """
from types import SimpleNamespace

from _gated import check, reverse


class AsyncLLMEngine:
    @classmethod
    def from_engine_args(cls, args):
        check(args.model)
        return cls()

    async def generate(self, prompt, sampling_params, request_id):
        # Each output holds the whole text so far, as vLLM's RequestOutput does.
        text = ""
        for word in reverse(prompt, sampling_params.max_tokens):
            text += word + " "
            yield SimpleNamespace(request_id=request_id, outputs=[SimpleNamespace(text=text)])
""",
    "whisper/__init__.py": """
import os

from whisper import tokenizer  # noqa: F401


class _Model:
    def __init__(self, name):
        self.name = name


def load_model(name, device=None):
    # A name is one of whisper's own (downloaded once); a path must hold the checkpoint.
    if name not in ("tiny", "base", "small") and not os.path.isfile(name):
        raise RuntimeError(f"Model {name} not found")
    return _Model(str(name))


def transcribe(model, path, **kwargs):
    with open(path, "rb") as audio:
        text = audio.read().split(b"\\n", 1)[0].decode()  # the "speech": the file's first line
    return {"language": "en", "text": text, "segments": [{"start": 0.0, "end": 1.5, "text": text, "id": 0}]}
""",
    "whisper/tokenizer.py": """
LANGUAGES = {"en": "english"}
""",
    "TTS/__init__.py": "",
    "TTS/utils/__init__.py": "",
    "TTS/utils/generic_utils.py": """
import os


def get_user_data_dir(appname):
    return os.path.join(os.environ.get("TTS_HOME") or os.path.expanduser("~/.local/share"), appname)
""",
    "TTS/utils/manage.py": """
import json
import os

from TTS.utils.generic_utils import get_user_data_dir


class ModelManager:
    def download_model(self, model_name):
        # Coqui's manager asks on the terminal unless the licence is agreed to in the environment.
        if os.environ.get("COQUI_TOS_AGREED") != "1":
            raise EOFError("> Do you agree to the terms of the CPML? [y/n]")
        folder = os.path.join(get_user_data_dir("tts"), model_name.replace("/", "--"))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as config:
            json.dump({"model": "xtts", "audio": {"output_sample_rate": 24000}}, config)
""",
    "TTS/tts/__init__.py": "",
    "TTS/tts/configs/__init__.py": "",
    "TTS/tts/configs/xtts_config.py": """
import json


class XttsConfig:
    def load_json(self, path):
        with open(path) as config:
            self.__dict__.update(json.load(config))
""",
    "TTS/tts/models/__init__.py": "",
    "TTS/tts/models/xtts.py": """
import os
from types import SimpleNamespace

import numpy as np
from torch import Array


class Xtts:
    @classmethod
    def init_from_config(cls, config):
        assert config.model == "xtts"
        return cls()

    def load_checkpoint(self, config, checkpoint_dir, eval=False, use_deepspeed=False):
        if not os.path.isdir(checkpoint_dir):
            raise FileNotFoundError(checkpoint_dir)
        speaker = {"speaker_embedding": Array(np.zeros((1, 512, 1))), "gpt_cond_latent": Array(np.zeros((1, 4, 1024)))}
        self.speaker_manager = SimpleNamespace(speakers={"Claribel Dervla": speaker})

    def to(self, device):
        return self

    def inference_stream(self, text, language, gpt_cond_latent, speaker_embedding, stream_chunk_size=20, **kwargs):
        # One chunk of stream_chunk_size samples a word, its level the word's length in tenths (clipped later).
        for word in text.split():
            yield Array(np.full(stream_chunk_size, len(word) / 10))
""",
    "chatterbox/__init__.py": "",
    "chatterbox/tts.py": """
import numpy as np
from torch import Array


class ChatterboxTTS:
    sr = 24000

    @classmethod
    def from_pretrained(cls, device):
        return cls()

    def generate(self, text, audio_prompt_path=None):
        # 100 samples a word; a cloned voice at the level of its prompt's first byte, else a quarter.
        level = 0.25
        if audio_prompt_path is not None:
            with open(audio_prompt_path, "rb") as prompt:
                level = prompt.read(1)[0] / 255
        return Array(np.full((1, 100 * len(text.split())), level))
""",
    "torchaudio/__init__.py": """
import wave

import numpy as np


def save(uri, src, sample_rate, format=None):
    samples = (np.clip(src.numpy(), -1, 1) * 32767).astype("<i2")
    with wave.open(uri, "wb") as out:
        out.setnchannels(samples.shape[0])
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(samples.T.tobytes())
""",
    "bin/nvidia-smi": """
#!/bin/sh
echo "stand-in nvidia-smi: no GPU"
""",
}

#: The audio file: its first line is what the stand-in whisper "hears". Longer than a file's write buffer, as
#: any real recording is: the examples write it to a NamedTemporaryFile and hand whisper its name unflushed.
AUDIO = b"four score and seven years ago\n" + bytes(16384)
TEXT = "four score and seven years ago"


class Audio(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "audio/mpeg")
        self.send_header("Content-Length", str(len(AUDIO)))
        self.end_headers()
        self.wfile.write(AUDIO)


@pytest.fixture(scope="module")
def audio_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Audio)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/Gettysburg.mp3"
    server.shutdown()
    server.server_close()


#: The examples, each served once for the module; all start together.
CASES = (
    "01-getting-started-bert",
    "03-llm-with-streaming",
    "05-speech-to-text",
    "09-private-huggingface",
    "10-using-system-packages",
    "layoutlm-document-qa",
    "llama/llama-2-7b-chat",
    "llama/llama-3_1-8b-instruct",
    "mistral/mistral-7b-instruct-vllm",
    "whisper/whisper-truss",
    "xtts-streaming",
    "chatterbox-tts",
    "../custom_openai_endpoints",  # one of Truss's own test models: its OpenAI-named methods read the body
)


@pytest.fixture(scope="module")
def pool(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """pool(case) -> the module's ready server of that example."""
    root = tmp_path_factory.mktemp("stand_ins")
    write(root, STAND_INS)
    nvidia_smi = root / "bin" / "nvidia-smi"
    nvidia_smi.chmod(nvidia_smi.stat().st_mode | stat.S_IEXEC)
    # whisper-truss reads data/models/small.pt, an external_data file that `python -m
    # modelserve.compat.truss_cache` downloads into the truss's data folder: a copy of the truss holds it here.
    whisper = tmp_path_factory.mktemp("whisper") / "whisper-truss"
    shutil.copytree(EXAMPLES / "whisper" / "whisper-truss", whisper)
    (whisper / "data" / "models").mkdir()
    (whisper / "data" / "models" / "small.pt").write_bytes(b"stand-in checkpoint")
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(root / "bin"), os.environ["PATH"]]),
        "hf_access_token": TOKEN,  # the secret, as modelserve reads it from the environment
        "TTS_HOME": str(tmp_path_factory.mktemp("tts_home")),
    }
    secrets = str(tmp_path_factory.mktemp("no_secrets"))
    servers = {
        case: start_server_module(
            whisper if case == "whisper/whisper-truss" else EXAMPLES / case, "--secrets-dir", secrets, env=env
        )
        for case in CASES
    }

    def ready(case: str) -> Any:
        servers[case].wait_ready()
        return servers[case]

    return ready


PREDICT = "/v1/models/model:predict"
JSON = {"accept": "application/json"}


def post(server: Any, payload: Any, path: str = PREDICT, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=payload, timeout=10, **kwargs)


def streamed(server: Any, payload: Any, path: str = PREDICT) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", server.url + path, json=payload, timeout=10) as answer:
        chunks = list(answer.iter_text())
    return answer, chunks


def test_bert_pipeline_answers_a_json_string(pool: Any) -> None:
    # README: truss predict -d '"Truss is awesome!"'; model_name: bert
    server = pool("01-getting-started-bert")
    expected = [{"label": "POSITIVE", "score": 0.75}]
    assert post(server, "Truss is awesome!").json() == expected
    assert post(server, "Truss is awesome!", "/bert").json() == expected
    assert post(server, ["is not", "is"]).json()[0]["label"] == "NEGATIVE"


def test_llm_with_streaming_streams_the_prompt_then_the_generation(pool: Any) -> None:
    # predict returns a sync generator that reads a TextIteratorStreamer fed by another thread
    server = pool("03-llm-with-streaming")
    answer, chunks = streamed(server, {"prompt": "what is the meaning of life"})
    assert answer.status_code == 200
    assert answer.headers.get("transfer-encoding") == "chunked"
    assert "".join(chunks) == "what is the meaning of life life of meaning the is what"


@pytest.mark.parametrize("case", ["05-speech-to-text", "whisper/whisper-truss"])
def test_whisper_preprocess_fetches_then_predict_transcribes(pool: Any, audio_url: str, case: str) -> None:
    # preprocess (and whisper-truss's postprocess) around a sync predict; whisper-truss loads
    # data_dir/models/small.pt, its external_data
    server = pool(case)
    answer = post(server, {"url": audio_url})
    assert answer.status_code == 200
    segments = [{"start": 0.0, "end": 1.5, "text": TEXT}]
    assert answer.json() == {"language": "english", "segments": segments, "text": TEXT}


def test_private_huggingface_gets_its_secret(pool: Any) -> None:
    # kwargs["secrets"]["hf_access_token"] (declared null in config.yaml) reaches the gated pipeline
    server = pool("09-private-huggingface")
    answer = post(server, "It is a [MASK] world")
    assert answer.json() == [{"sequence": "It is a good world", "token_str": "good", "score": 0.5}]
    assert TOKEN not in httpx.get(server.url + "/private-model").text


@pytest.mark.parametrize("case", ["10-using-system-packages", "layoutlm-document-qa"])
def test_document_qa(pool: Any, case: str) -> None:
    # system_packages is the platform's; layoutlm also takes data_dir, config and secrets
    server = pool(case)
    url = "https://templates.invoicehome.com/invoice-template-us-neat-750px.png"
    answer = post(server, {"url": url, "prompt": "What is the invoice number?"})
    assert answer.json() == [
        {"answer": "invoice-template-us-neat-750px.png", "question": "What is the invoice number?", "score": 0.5}
    ]


def test_llama_2_chat_answers_a_list_and_streams(pool: Any) -> None:
    # preprocess and postprocess around predict; stream: false returns the decoded beams. The secret's value
    # in config.yaml is a placeholder: the mounted one counts.
    server = pool("llama/llama-2-7b-chat")
    request = {"num_beams": 4, "prompt": "What's the meaning of life?", "temperature": 0.1, "top_p": 0.75}
    answer = post(server, {**request, "max_length": 3})
    assert answer.json() == [" [/INST] life? of"]
    # stream: true returns a generator while the class has a postprocess: Truss's server refuses that call
    # ("If the predict function returns a generator (streaming), you cannot use postprocessing"), and so
    # does modelserve, with a 500 that names the request and a log line that names the reason.
    answer = post(server, {**request, "stream": True, "max_length": 4})
    assert answer.status_code == 500
    assert answer.json()["request_id"] in server.log
    assert "postprocess" in server.log


@pytest.mark.parametrize("case", ["mistral/mistral-7b-instruct-vllm", "llama/llama-3_1-8b-instruct"])
def test_vllm_async_predict_streams_by_default(pool: Any, case: str) -> None:
    # async predict returns an async generator of deltas (stream defaults to true) or, for stream: false,
    # a dict; engine arguments come from kwargs["config"]["model_metadata"], the token from kwargs["secrets"]
    server = pool(case)
    answer, chunks = streamed(server, {"prompt": "What is the Mistral wind?", "max_tokens": 3})
    assert answer.status_code == 200
    text = "".join(chunks)
    # the prompt, as the example formats it (prompt_format, or the tokenizer's chat template), reversed
    assert text == ("[/INST] wind? Mistral " if "mistral" in case else "wind?<|assistant|> Mistral the ")
    whole = post(server, {"prompt": "What is the Mistral wind?", "max_tokens": 3, "stream": False})
    assert whole.json() == {"text": text}
    # Accept: application/json gathers the stream into one JSON string, as Truss's _gather_generator does
    gathered = post(server, {"prompt": "What is the Mistral wind?", "max_tokens": 3}, headers=JSON)
    assert gathered.json() == text
    # runtime.predict_concurrency: 256 and 128
    name = "mistral-7b-instruct-vllm" if "mistral" in case else "llama-3.1-8b-instruct-vllm"
    expected = 256 if "mistral" in case else 128
    assert httpx.get(f"{server.url}/{name}", timeout=10).json()["max_concurrency"] == expected


def test_xtts_streams_the_bytes_a_generator_predict_yields(pool: Any) -> None:
    # predict is a generator function yielding raw int16 audio; environment_variables sets COQUI_TOS_AGREED,
    # without which Coqui's ModelManager asks on the terminal and load() fails
    server = pool("xtts-streaming")
    with httpx.stream("POST", server.url + PREDICT, json={"text": "Hello big world", "chunk_size": 4}) as answer:
        body = answer.read()
    assert answer.status_code == 200
    samples = np.frombuffer(body, dtype=np.int16)
    levels = [min(len(word) / 10, 1.0) for word in ("Hello", "big", "world")]
    assert samples.tolist() == [int(np.float32(level) * 32767) for level in levels for _ in range(4)]


def test_chatterbox_answers_base64_wav(pool: Any) -> None:
    # base_image and python_version py312 are the platform's; the answer is {"audio": <base64 wav>}
    server = pool("chatterbox-tts")
    voice = base64.b64encode(bytes([255]) + bytes(99)).decode()
    for request, level in (({"text": "two words"}, 0.25), ({"text": "two words", "voice": voice}, 1.0)):
        audio = base64.b64decode(post(server, request).json()["audio"])
        with wave.open(io.BytesIO(audio)) as wav:
            assert (wav.getframerate(), wav.getnframes()) == (24000, 200)
            assert np.frombuffer(wav.readframes(1), dtype="<i2")[0] == int(np.float32(level) * 32767)


FORM = {"content-type": "application/x-www-form-urlencoded"}


def test_a_curl_d_body_is_json_on_truss_paths(pool: Any) -> None:
    # `curl -X POST .../predict -H 'Authorization: ...' -d '{"prompt": "man on moon"}'` (truss-examples'
    # deepfloyd-xl and gfp-gan READMEs) sends the JSON as a form: Truss's server parses every body that is not
    # msgpack as JSON, so the model gets the dict. Was: the body's bytes, and the model's 500.
    server = pool("layoutlm-document-qa")
    body = b'{"url": "https://example.com/a.png", "prompt": "What is the total?"}'
    expected = [{"answer": "a.png", "question": "What is the total?", "score": 0.5}]
    for path in (PREDICT, "/v1/models/layoutlm-document-qa:predict", "/invocations"):
        answer = httpx.post(server.url + path, content=body, headers=FORM, timeout=10)
        assert (answer.status_code, answer.json()) == (200, expected), path
    answer = httpx.post(server.url + PREDICT, content=b"url=a&prompt=b", headers=FORM, timeout=10)
    assert answer.status_code == 400  # not JSON: a 400 that says so, as Truss's "Invalid JSON payload"
    assert "JSON" in answer.json()["error"]
    # the OpenAI-named methods of a Truss read their body the same way
    server = pool("../custom_openai_endpoints")
    for path in ("/v1/completions", "/v1/embeddings"):
        answer = httpx.post(server.url + path, content=b'{"increment": 2}', headers=FORM, timeout=10)
        assert (answer.status_code, answer.json()) == (200, 2), path


def test_an_engine_builder_truss_is_refused_at_start_saying_what_trt_llm_is() -> None:
    # custom-engine-builder-control's Model(trt_llm, **kwargs) takes trt_llm["engine"], the TensorRT-LLM engine
    # that Baseten's engine builder (config.yaml's trt_llm) runs beside the model: no local server has one.
    # The start fails, before any request, naming the argument and what it is. Was: the argument only.
    project = EXAMPLES / "custom-engine-builder-control"
    command = [sys.executable, "-m", "modelserve", str(project), "--port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode != 0
    assert "requires ['trt_llm']" in done.stderr
    assert "'trt_llm' is the TensorRT-LLM engine (Briton) that Baseten's engine builder runs" in done.stderr
