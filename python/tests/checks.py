"""The PyTorch tests' one check: prints "ok: MSG" or "FAIL: MSG" and counts the failures; a test's
main returns check.exit_code() after printing check.summary()."""


class Checks:
    def __init__(self):
        self.failures = 0

    def __call__(self, cond, msg):
        print(("ok: " if cond else "FAIL: ") + msg, flush=True)
        if not cond:
            self.failures += 1
        return bool(cond)

    def summary(self):
        return "%d failures" % self.failures

    def exit_code(self):
        return 1 if self.failures else 0


check = Checks()
