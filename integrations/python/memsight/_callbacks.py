"""What the framework callbacks share: phases opened in one hook and closed in another, and the
step marked once per optimizer step (several micro-batches share one under gradient accumulation).
"""

import memsight


class Marks:
    """The phases a callback holds open, innermost last, the last step it marked, and whether it
    adds PyTorch's device memory when training starts (``install_torch``, every ``interval`` s)."""

    def __init__(self, install_torch=True, interval=0.1):
        self._open = []  # [(name, memsight.phase)]
        self._step = None
        self.install_torch = install_torch
        self.interval = interval

    def start(self):
        """Training starts: installs the PyTorch integration, unless asked not to."""
        if self.install_torch:
            import memsight.torch

            memsight.torch.install(self.interval)

    def step(self, n):
        """Marks step ``n`` unless it is the step already marked."""
        n = int(n)
        if n != self._step:
            self._step = n
            memsight.step(n)

    def open(self, name):
        """Opens phase ``name`` inside the open ones, unless it is already open."""
        if not self.is_open(name):
            p = memsight.phase(name)
            p.__enter__()
            self._open.append((name, p))

    def is_open(self, name):
        return any(n == name for n, _ in self._open)

    def close(self, name):
        """Closes phase ``name`` and any opened inside it; nothing when it is not open."""
        while self.is_open(name):
            n, p = self._open.pop()
            p.__exit__(None, None, None)
            if n == name:
                return

    def close_all(self):
        """Closes every open phase (training ended or failed)."""
        while self._open:
            self._open.pop()[1].__exit__(None, None, None)
