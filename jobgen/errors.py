"""The one family of errors jobgen shows to users; the CLI maps them to exit codes in one place."""


class JobgenError(Exception):
    """A user-facing problem: the message is printed as one line, the exit status is `exit_code`."""

    exit_code = 2


class ConfigError(JobgenError):
    """A recipe, site profile or --set value is malformed (names the file and the key path)."""


class RuleError(ConfigError):
    """A well-formed value breaks a rule of the platform or the parallelism arithmetic.

    `jobgen check` lists these as skipped combinations, not as failures.
    """


class RenderError(JobgenError):
    """A template could not be rendered (a bug in jobgen or a template), or a value is unsafe."""


class RemoteError(JobgenError):
    """A scheduler or cloud API refused or failed (no credentials, unknown queue, sbatch error)."""

    exit_code = 1
