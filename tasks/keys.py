"""Every Redis key and channel onelane uses. No other module formats a key.

Lua scripts that must reach keys chosen at run time (the job at the head of the queue, its owner's
queue) get the names and prefixes below written into them (LUA_NAMES, by tasks/scripts.py), so the names still
come from this module only.
"""

from __future__ import annotations

NS = "onelane:"

JOB_PREFIX = NS + "job:"  # hash: the job record (layout in tasks/store/jobs.py)
OUTPUT_PREFIX = NS + "out:"  # string: the output text so far
TOKENS_PREFIX = NS + "tokens:"  # string: the ids of the tokens its runs generated so far, each followed by a comma
#                                 (a requeued job goes on from them); removed when the job ends
LOGPROBS_PREFIX = NS + "lp:"  # string: a job's generated tokens' log probabilities (tasks/logprobs.py), if it asked
#                                for them: one entry per token, each followed by a newline; lives as its output
EVENTS_PREFIX = NS + "ev:"  # list: the job's durable event log (started, token..., terminal)
CHANNEL_PREFIX = NS + "ch:"  # pub/sub: live copy of each event, with its index in the log
USER_QUEUE_PREFIX = NS + "q:"  # sorted set: one user's waiting job ids, by the same score as QUEUE
USER_JOBS_PREFIX = NS + "jobs:"  # sorted set: one user's recent job ids by admission time

MODEL_QUEUE_PREFIX = NS + "mq:"  # sorted set: one model's waiting job ids, by the same score as QUEUE
MODEL_PREFIX = NS + "model:"  # hash: a model's load outcome (state, load_s, bytes, error, retry_at, worker, deaths:
#                               the workers its load killed in a row, lapsed: the worker whose lease lapsed in its
#                               load, not known dead yet) and its measured pace (worker/pace.py), kept
#                               MODEL_RECORD_TTL_S; its load's fields written by the device's holder only
LENGTHS_PREFIX = NS + "lengths:"  # list: the newest LENGTHS_KEPT completed answers of one model, each
#                                   "completion,max_tokens,how,prompt_chars,prompt_tokens" (how: s ended by itself,
#                                   l at max_tokens, i ignore_eos), for ETAs; kept MODEL_RECORD_TTL_S
AFFINITY_PREFIX = (
    NS + "affinity:"
)  # string, kept ONELANE_RESULT_TTL: the device whose prefix cache holds a conversation's
#                                     history (the digest of it a follow-up's admission computes; tasks/job.py)
ADDRESS_PREFIX = NS + "address:"  # set, in local mode: the browser visitors of one client address with jobs waiting
#                                   (admit.lua), living as long as the jobs it counts

FILE_PREFIX = NS + "file:"  # hash, kept ONELANE_FILE_RETENTION: an uploaded file's record (tasks/files.py)
FILE_DATA_PREFIX = NS + "file-data:"  # string, the same TTL: the file's bytes
IMAGE_PREFIX = (
    NS + "image:"
)  # string: an image's bytes by their SHA-256, kept while an owner holds it (tasks/lua/images.lua:
#                                a job holding it may wait and run, or a completed one's follow-up may resend it)
IMAGE_UPLOAD_PREFIX = NS + "image-upload:"  # string, kept UPLOAD_TTL_S: an image's bytes on their way to admission,
#                                             by request and digest (moved to IMAGE_PREFIX as it admits the job, or dropped)
IMAGE_OWNERS_PREFIX = NS + "image-owners:"  # sorted set: an image's owners, by until when each holds it (its life)
USER_IMAGES_PREFIX = NS + "user-images:"  # sorted set: the images one owner holds, by until when (its last hold's life)
USER_IMAGE_INFO_PREFIX = NS + "user-image-info:"  # hash: of each image one owner holds, its size, the owner's live jobs
#                                                   holding it and until when it is kept after them; and their bytes
IMAGES = NS + "images"  # sorted set: "digest size" of every image kept, by until when (its last image's life)
IMAGE_BYTES = NS + "image-bytes"  # string: the bytes of every image kept (the same life)
USER_FILES_PREFIX = NS + "files:"  # sorted set: one user's file ids by upload time (expired ids trimmed at upload)

BATCH_PREFIX = NS + "batch:"  # hash: a batch's record (tasks/batches.py); kept its completion window + the retention
BATCH_LINES_PREFIX = NS + "batch-lines:"  # list: the batch's lines not admitted yet, in file order (removed at its end)
BATCH_RUNNING_PREFIX = NS + "batch-running:"  # hash: job id -> line, the batch's lines admitted and not collected
BATCH_OUTPUT_PREFIX = NS + "batch-out:"  # hash: line index -> result line, of the lines that succeeded (removed at
#                                        its end, once in the output file)
BATCH_ERRORS_PREFIX = NS + "batch-err:"  # hash: line index -> result line, of the lines that failed (likewise)
BATCH_CHANNEL_PREFIX = NS + "batch-ch:"  # pub/sub: "the batch moved" (a line ended, its status changed)
BATCH_LOCK_PREFIX = NS + "batch-lock:"  # string, a few seconds: who runs the batch's round now
USER_BATCHES_PREFIX = NS + "batches:"  # sorted set: one user's batch ids by creation time (expired ids trimmed)
BATCHES = NS + "batches"  # sorted set: the batches not ended yet, by creation time (the runners' work list)

QUEUE = NS + "queue"  # sorted set: every waiting job id by its fair-queuing tag (common.lua queue_score): the run order
WAITING = NS + "waiting"  # sorted set: every waiting job id by its deadline
WATCHED = NS + "watched"  # sorted set: waiting watched job ids by when their watcher's lease lapses
VIRTUAL_TIME = NS + "vtime"  # string: the start tag of the job claimed last
NEXT_TAGS = NS + "next-tags"  # sorted set: flow (user, or "user|batch") by the start tag its next job gets at the
#                               earliest (kept only while above the virtual time: a flow with nothing waiting or
#                               just run has none)
BLOCKED = NS + "blocked"  # hash: the head job that jobs of a loaded model went ahead of (id), and since when
SEQUENCE = NS + "seq"  # string: admission counter, breaks ties between equal tags
QUEUE_MOVED = NS + "queue-moved"  # pub/sub: "the queue changed, recompute your position"
IN_PROGRESS = NS + "in-progress"  # sorted set: running job ids by started_at
DEVICE_PREFIX = NS + "device:"  # hash with a short TTL: the lease of the worker that owns a device
WORKER_PREFIX = NS + "worker:"  # hash, kept WORKER_RECORD_TTL_S: what became of a worker process whose lease ended
#                                 (dead: its supervisor reaped it; woke: it renewed after it lapsed; hung: its keeper
#                                 stopped renewing it as hung; lost: the jobs its lapse handed back uncounted), for
#                                 housekeep.lua and failed_models.lua to tell a late worker from a dead one
HOLDERS_PREFIX = NS + "holders:"  # list, kept WORKER_RECORD_TTL_S: the last HOLDERS_KEPT workers to take a device's
#                                   lease ("pid worker"), for a supervisor to name one dead after its lease lapsed
DEVICES = NS + "devices"  # set: device names seen, for health checks
STATS = NS + "stats"  # hash: counters and histogram buckets behind /metrics
CANCELS = NS + "cancels"  # pub/sub: ids of running jobs asked to stop, for the worker's listener
LIVE = NS + "live"  # pub/sub: ids of running jobs a stream opened on, for the worker's listener (worker/listener.py),
#                     which tells its output writer (worker/output.py)
MINUTE_PREFIX = NS + "minute:"  # hash, kept MINUTE_TTL_S: what happened in one minute (jobs ended by status, tokens,
#                                 queue waits), for the dashboard's plots of the last hour
SERVICE = NS + "service"  # sorted set: each flow's service, the token units its ended jobs were charged (fair order,
#                           tasks/lua/common.lua charge_used), for /metrics; the SERVICE_KEPT most served, kept SERVICE_TTL_S
FAILURES = NS + "failures"  # list: the newest FAILURES_KEPT failed or expired job ids, living as long as the newest
#                             one's record

MINUTE_TTL_S = 7200  # a minute's record outlives the hour the dashboard plots
MODEL_RECORD_TTL_S = 7 * 86400  # a model's record (keys.model) outlives no week without news
WORKER_RECORD_TTL_S = 3600  # a worker that wakes later than this after its lease lapsed was hung, not late
FAILURES_KEPT = 50
LENGTHS_KEPT = 100
SERVICE_KEPT = 1000
SERVICE_TTL_S = 30 * 86400
HOLDERS_KEPT = 8
UPLOAD_TTL_S = 60  # an image upload whose admission never came (its web process died between the two)


def job(job_id: str) -> str:
    return JOB_PREFIX + job_id


def output(job_id: str) -> str:
    return OUTPUT_PREFIX + job_id


def logprobs(job_id: str) -> str:
    return LOGPROBS_PREFIX + job_id


def tokens(job_id: str) -> str:
    return TOKENS_PREFIX + job_id


def events(job_id: str) -> str:
    return EVENTS_PREFIX + job_id


def channel(job_id: str) -> str:
    return CHANNEL_PREFIX + job_id


def user_queue(owner: str) -> str:
    return USER_QUEUE_PREFIX + owner


def dramatiq_queue(namespace: str, queue_name: str) -> str:
    """dramatiq's list of message ids waiting on a queue (its Redis broker's layout, not ours)."""
    return f"{namespace}:{queue_name}"


def dramatiq_messages(namespace: str, queue_name: str) -> str:
    """dramatiq's hash of message id -> encoded message for a queue (its Redis broker's layout)."""
    return f"{namespace}:{queue_name}.msgs"


def model_queue(model: str) -> str:
    return MODEL_QUEUE_PREFIX + model


def model(name: str) -> str:
    return MODEL_PREFIX + name


def address_visitors(address: str) -> str:
    return ADDRESS_PREFIX + address


def device(name: str) -> str:
    return DEVICE_PREFIX + name


def user_jobs(owner: str) -> str:
    return USER_JOBS_PREFIX + owner


def minute(index: int) -> str:
    """The record of the minute `index` (seconds since the epoch // 60, by Redis's clock)."""
    return f"{MINUTE_PREFIX}{index}"


#: The key names and prefixes the Lua scripts use, under the constant names they use them by (tasks/scripts.py writes
#: them into every script), and the bounds of the dashboard's records.
LUA_NAMES: dict[str, str | int] = {
    "JOB": JOB_PREFIX, "OUT": OUTPUT_PREFIX, "LP": LOGPROBS_PREFIX, "TOK": TOKENS_PREFIX, "EV": EVENTS_PREFIX, "CH": CHANNEL_PREFIX,
    "UQ": USER_QUEUE_PREFIX, "UJ": USER_JOBS_PREFIX, "QUEUE": QUEUE, "WAITING": WAITING, "WATCHED": WATCHED,
    "MOVED": QUEUE_MOVED, "IN_PROGRESS": IN_PROGRESS, "LENGTHS": LENGTHS_PREFIX, "VTIME": VIRTUAL_TIME, "TAGS": NEXT_TAGS,
    "SEQ": SEQUENCE, "DEVICE": DEVICE_PREFIX, "DEVICES": DEVICES, "STATS": STATS, "CANCELS": CANCELS,
    "LIVE": LIVE, "MQ": MODEL_QUEUE_PREFIX, "MODEL": MODEL_PREFIX, "BLOCKED": BLOCKED, "MINUTE": MINUTE_PREFIX,
    "FAILURES": FAILURES, "AFFINITY": AFFINITY_PREFIX, "MINUTE_TTL": MINUTE_TTL_S, "FAILURES_KEPT": FAILURES_KEPT,
    "MODEL_RECORD_TTL": MODEL_RECORD_TTL_S, "LENGTHS_KEPT": LENGTHS_KEPT, "SERVICE": SERVICE,
    "SERVICE_KEPT": SERVICE_KEPT, "SERVICE_TTL": SERVICE_TTL_S, "WORKER": WORKER_PREFIX,
    "HOLDERS": HOLDERS_PREFIX, "WORKER_RECORD_TTL": WORKER_RECORD_TTL_S, "HOLDERS_KEPT": HOLDERS_KEPT,
    "IMAGE": IMAGE_PREFIX, "IMAGE_OWNERS": IMAGE_OWNERS_PREFIX, "USER_IMAGES": USER_IMAGES_PREFIX,
    "USER_IMAGE_INFO": USER_IMAGE_INFO_PREFIX, "IMAGES": IMAGES, "IMAGE_BYTES": IMAGE_BYTES,
}  # fmt: skip


def file(file_id: str) -> str:
    return FILE_PREFIX + file_id


def image(digest: str) -> str:
    return IMAGE_PREFIX + digest


def image_upload(request: str, digest: str = "") -> str:
    """An image's upload for one request's admission ("": the prefix of that request's uploads)."""
    return f"{IMAGE_UPLOAD_PREFIX}{request}:{digest}"


def image_owners(digest: str) -> str:
    return IMAGE_OWNERS_PREFIX + digest


def user_images(owner: str) -> str:
    return USER_IMAGES_PREFIX + owner


def user_image_info(owner: str) -> str:
    return USER_IMAGE_INFO_PREFIX + owner


def file_data(file_id: str) -> str:
    return FILE_DATA_PREFIX + file_id


def user_files(owner: str) -> str:
    return USER_FILES_PREFIX + owner


def batch(batch_id: str) -> str:
    return BATCH_PREFIX + batch_id


def batch_lines(batch_id: str) -> str:
    return BATCH_LINES_PREFIX + batch_id


def batch_running(batch_id: str) -> str:
    return BATCH_RUNNING_PREFIX + batch_id


def batch_output(batch_id: str) -> str:
    return BATCH_OUTPUT_PREFIX + batch_id


def batch_errors(batch_id: str) -> str:
    return BATCH_ERRORS_PREFIX + batch_id


def batch_channel(batch_id: str) -> str:
    return BATCH_CHANNEL_PREFIX + batch_id


def batch_lock(batch_id: str) -> str:
    return BATCH_LOCK_PREFIX + batch_id


def user_batches(owner: str) -> str:
    return USER_BATCHES_PREFIX + owner
