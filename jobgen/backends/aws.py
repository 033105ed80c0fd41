"""The AWS layer every AWS-facing backend and `jobgen watch` share: one boto3 client per service
with the AWS CLI's precedence for region, profile and endpoint, and `call`, the one place where
throttling is retried and AWS's exceptions become one-line jobgen errors.

boto3 is imported inside `client()` only, so rendering never loads the AWS SDK; every other
function takes its clients as arguments (tests hand in clients pointed at moto). Set-up mistakes
are blamed on the file or variable that holds them, and no message shows a secret (`redact`).
"""
from __future__ import annotations

import os
import re
import urllib.parse
import weakref
from typing import Any, Callable, Optional

from ..inputs.site import Site, region_problem
from ..plumbing.errors import ConfigError, JobgenError, RemoteError

Echo = Callable[[str], None]
THROTTLED = ("Throttling", "ThrottlingException", "TooManyRequestsException",
             "RequestLimitExceeded", "SlowDown")
# botocore retries throttling and transient errors itself ("standard" mode: exponential backoff
# with jitter); these are jobgen's defaults where the user's AWS config sets neither.
RETRY_MODE, MAX_ATTEMPTS = "standard", 5
NO_CREDENTIALS = ("no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                  "AWS_SECRET_ACCESS_KEY, or run `aws configure`")
SERVICE_ENV = {"batch": "BATCH", "logs": "CLOUDWATCH_LOGS",   # AWS_ENDPOINT_URL_<this>
               "sagemaker": "SAGEMAKER"}
# Where each client's endpoint came from, for messages about not reaching it.
_ORIGINS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s\"']*@")
_USER_PASSWORD = re.compile(r"[^\s/?#@\"':]+:[^\s/?#@\"']+@")   # user:password@ anywhere


def redact(text: str) -> str:
    """`text` without the user:password part of any URL in it, nor the secrets of the AWS
    credentials in this environment."""
    text = _USER_PASSWORD.sub("***@", _USERINFO.sub(r"\1***@", text))
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        secret = os.environ.get(name, "")
        if len(secret) >= 16:
            text = text.replace(secret, "***")
    return text


def _remote(message: str) -> RemoteError:
    return RemoteError(redact(message))


def _config(message: str) -> ConfigError:
    return ConfigError(redact(message))


# --region and --profile of the command being run (the AWS CLI's flags; set by the CLI).
FLAGS: dict[str, str] = {}


def region(site: Site, service: str = "batch") -> tuple[Optional[str], str]:
    """The region and where it came from, in the AWS CLI's order: --region, AWS_REGION (which
    botocore itself ignores), AWS_DEFAULT_REGION, the site profile (its sagemaker section for
    SageMaker, else its batch section), or else the AWS profile's (left to botocore). A region
    that is not an AWS region name is refused here, wherever it came from (the environment
    too), before it reaches a rendered request or a client."""
    found: Optional[tuple[str, str]] = None
    if FLAGS.get("region"):
        found = FLAGS["region"], "--region"
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if found is None and os.environ.get(name):
            found = os.environ[name], name
    key = "sagemaker" if service == "sagemaker" else "batch"
    section = getattr(site, key, None)
    if found is None and section is not None and section.region:
        found = section.region, f"site {site.name}: {key}.region"
    if found is not None:
        said = region_problem(found[0])
        if said is not None:   # the environment's: a set-up mistake (1)
            error = _config if found[1].startswith(("site ", "--")) else _remote
            raise error(f"{found[1]}: {found[0]!r} {said}")
        return found
    profile = FLAGS.get("profile") or os.environ.get("AWS_PROFILE") or "default"
    return None, f"{_aws_file('AWS_CONFIG_FILE', 'config')} (region of profile {profile})"


def _endpoint_origin(endpoint_url: Optional[str], service: str) -> tuple[Optional[str], str]:
    """The endpoint URL that will be used, if jobgen can see it, and where it came from."""
    if endpoint_url is not None:
        return endpoint_url, "--endpoint-url"
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() != "true":
        for name in (f"AWS_ENDPOINT_URL_{SERVICE_ENV[service]}", "AWS_ENDPOINT_URL"):
            if os.environ.get(name):
                return os.environ[name], name
    return None, f"{_aws_file('AWS_CONFIG_FILE', 'config')} (endpoint_url)"


def _valid_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and \
            (parts.port is None or parts.port > 0)
    except ValueError:   # e.g. a port that is not a number
        return False


def _setup_error(exc: Exception) -> Optional[JobgenError]:
    """AWS set-up mistakes (profile, config files, credentials, region) as one line that
    names what to fix; None for anything else."""
    from botocore import exceptions as bce

    kwargs = getattr(exc, "kwargs", {})
    if isinstance(exc, bce.ProfileNotFound):
        var = "AWS_PROFILE" if os.environ.get("AWS_PROFILE") else "AWS_DEFAULT_PROFILE"
        if FLAGS.get("profile"):
            return _config(f"--profile: no profile {kwargs.get('profile')!r} in "
                           f"{_aws_file('AWS_CONFIG_FILE', 'config')} or "
                           f"{_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}")
        return _remote(f"{var}: no profile {kwargs.get('profile')!r} in "
                       f"{_aws_file('AWS_CONFIG_FILE', 'config')} or "
                       f"{_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}")
    if isinstance(exc, bce.ConfigParseError):
        return _remote(f"{kwargs.get('path')}: not a valid AWS config or credentials file "
                       "(INI sections like [default] or [profile NAME], then key = value)")
    if isinstance(exc, bce.PartialCredentialsError):
        provider = kwargs.get("provider", "?")
        where = {"env": "in the environment",
                 "shared-credentials-file":
                     f"in {_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}",
                 "config-file": f"in {_aws_file('AWS_CONFIG_FILE', 'config')}"}.get(
                     provider, f"from {provider}")
        return _remote(f"incomplete AWS credentials {where}: {kwargs.get('cred_var')} is "
                       "missing (an access key id needs its secret access key)")
    if isinstance(exc, bce.NoCredentialsError):
        return _remote(NO_CREDENTIALS)
    if isinstance(exc, bce.InvalidRegionError):
        return _remote(f"{_aws_file('AWS_CONFIG_FILE', 'config')}: region "
                       f"{kwargs.get('region_name')!r} is not an AWS region name (like us-east-1)")
    if isinstance(exc, bce.NoRegionError):
        return _config("no AWS region: set batch.region in the site profile, or AWS_REGION")
    return None


def _aws_file(var: str, default: str) -> str:
    return os.environ.get(var) or f"~/.aws/{default}"


def client(site: Site, endpoint_url: Optional[str] = None, service: str = "batch",
           region_of: Optional[str] = None) -> Any:
    """A boto3 client for `service` ("batch" or "logs") in the site's region (else the
    environment's). Without `endpoint_url` boto3 itself honours AWS_ENDPOINT_URL. Set-up
    mistakes are blamed on what holds them: the site file, an option, a variable, a file."""
    from ..plumbing.extras import require
    extra = "sagemaker" if service == "sagemaker" else "batch"
    require(f"jobgen --backend {extra}" if extra != "batch" else "jobgen batch",
            ("boto3", "botocore"), extra)
    import boto3
    import botocore.config
    import botocore.exceptions as bce

    name, region_from = region(site, region_of or service)   # checked there
    url, url_from = _endpoint_origin(endpoint_url, service)
    if url is not None and not _valid_url(url):
        error = _config if url_from == "--endpoint-url" else _remote
        raise error(f"{url_from}: {url!r} is not an endpoint URL (like https://host:port)")
    try:
        session = boto3.session.Session(region_name=name,
                                        profile_name=FLAGS.get("profile") or None)
    except bce.BotoCoreError as exc:
        raise _setup_error(exc) or _remote(f"AWS set-up: {_first_line(str(exc))}") from None
    retries = _retries(session)
    try:
        config = botocore.config.Config(retries=retries)
        # A fresh session per client: the default one caches credentials across calls.
        made = session.client(service, endpoint_url=endpoint_url, config=config)
    except bce.NoRegionError:
        raise _config(f"site {site.name}: no AWS region: set batch.region in the site profile, "
                      "or AWS_REGION") from None
    except bce.BotoCoreError as exc:
        raise _setup_error(exc) or _remote(f"AWS set-up: {_first_line(str(exc))}") from None
    except ValueError as exc:   # a malformed endpoint URL in the AWS config file
        raise _remote(f"{url_from}: {_first_line(str(exc))}") from None
    said = region_problem(made.meta.region_name or "us-east-1")
    if said is not None:   # the AWS config file's (botocore takes upper case)
        raise _remote(f"{region_from}: {made.meta.region_name!r} {said}")
    if url is None:
        url_from = f"region {made.meta.region_name} from {region_from}"
    _ORIGINS[made] = f"endpoint from {url_from}" if url is not None else url_from
    return made


def _retries(session: Any) -> dict[str, Any]:
    """botocore's retry settings: the user's (AWS_RETRY_MODE / AWS_MAX_ATTEMPTS, or retry_mode /
    max_attempts in the AWS config file) where set, else RETRY_MODE and MAX_ATTEMPTS."""
    from botocore import exceptions as bce

    core = session._session   # boto3's botocore session: its config store reads env and files
    try:
        retries: dict[str, Any] = {"mode": core.get_config_variable("retry_mode") or RETRY_MODE}
        attempts = core.get_config_variable("max_attempts")
    except ValueError:   # botocore's int() of a value that is not a whole number
        where = ("AWS_MAX_ATTEMPTS" if os.environ.get("AWS_MAX_ATTEMPTS")
                 else _aws_file("AWS_CONFIG_FILE", "config"))
        raise _remote(f"{where}: max_attempts is not a whole number") from None
    except bce.BotoCoreError as exc:   # a config file botocore cannot parse
        raise _setup_error(exc) or _remote(f"AWS set-up: {_first_line(str(exc))}") from None
    if attempts is None:
        retries["total_max_attempts"] = MAX_ATTEMPTS
    return retries


def call(method: Callable[..., Any], *, client: Any = None, **params: Any) -> Any:
    """`method(**params)` (a boto3 client method, or a paginator's of `client`; botocore
    retries throttling itself), with every AWS failure turned into one line (with no password
    or secret in it)."""
    from botocore import exceptions as bce

    owner = client if client is not None else getattr(method, "__self__", None)
    meta = getattr(owner, "meta", None)
    where = f"AWS {meta.service_model.service_id}" if meta else "AWS"
    try:
        return method(**params)
    except bce.ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", str(exc))
        if code in THROTTLED:
            tries = int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) + 1
            raise _remote(f"{where} {exc.operation_name}: throttled ({code}) after {tries} "
                          f"attempt{'s' if tries > 1 else ''}; try again later") from None
        raise _remote(f"{where} {exc.operation_name}: {message} ({code})") from None
    except bce.ParamValidationError as exc:
        raise _config(f"{where} request: {_first_line(str(exc))}") from None
    except bce.EndpointConnectionError as exc:
        origin = _ORIGINS.get(owner) if owner is not None else None
        raise _remote(f"cannot reach AWS: {exc}" + (f" ({origin})" if origin else "")) from None
    except bce.BotoCoreError as exc:
        raise _setup_error(exc) or _remote(f"{where}: {_first_line(str(exc))}") from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # botocore's ParamValidationError starts with a generic header line.
    if len(lines) > 1 and lines[0].startswith("Parameter validation failed"):
        return lines[1]
    return lines[0] if lines else text


class LogStream:
    """One CloudWatch log stream, read on from where the last read stopped (its forward token):
    Batch's node logs, SageMaker's instance logs, and `jobgen watch` on SageMaker."""

    def __init__(self, logs: Any, group: str, stream: str) -> None:
        self.logs = logs
        self.params: dict[str, Any] = {"logGroupName": group, "logStreamName": stream,
                                       "startFromHead": True}

    def read(self) -> list[str]:
        """The messages added since the last read (every page of them)."""
        out: list[str] = []
        while True:
            page = call(self.logs.get_log_events, **self.params)
            out += [event.get("message", "") for event in page.get("events", [])]
            token = page.get("nextForwardToken")
            if not token or token == self.params.get("nextToken"):
                return out
            self.params["nextToken"] = token   # more may be waiting: read on at once


def follow(stream: LogStream, echo: Callable[[str], None], *, keep_on: bool,
           ended: Callable[[], bool], pause: Callable[[], None], end: str = "") -> None:
    """Print the stream's messages (each followed by `end`); with `keep_on`, until `ended()`."""
    while True:
        for message in stream.read():
            echo(message + end)
        if not keep_on or ended():
            return
        pause()
