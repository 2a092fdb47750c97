"""Small models the GPU scenarios train or run (S3's learner and actors, THROUGHPUT): the same
MLP regression in JAX and PyTorch, and a pure-Python stand-in for --simulate runs. Frameworks are
imported when a model is built, never at import time.
"""


def gpu_or(platform):
    """JAX names CUDA devices' platform "gpu" (some builds "cuda"): one name for the checks."""
    return "gpu" if platform in ("gpu", "cuda") else platform


class JaxModel:
    """An MLP regression trained with plain SGD under jit (learner, THROUGHPUT)."""

    def __init__(self, width=1024, depth=3, batch=1024, seed=0):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        key = jax.random.PRNGKey(seed)
        sizes = [width] * (depth + 1) + [16]
        params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            key, sub = jax.random.split(key)
            params.append((jax.random.normal(sub, (fan_in, fan_out)) / fan_in ** 0.5, jnp.zeros((fan_out,))))
        key, data_key, target_key = jax.random.split(key, 3)
        self.x = jax.random.normal(data_key, (batch, width))
        self.y = jnp.tanh(self.x @ jax.random.normal(target_key, (width, 16)) / width ** 0.5)
        self.params = params
        self.platform = gpu_or(jax.devices()[0].platform)

        def loss(params, x, y):
            h = x
            for weight, bias in params[:-1]:
                h = jnp.tanh(h @ weight + bias)
            weight, bias = params[-1]
            return jnp.mean((h @ weight + bias - y) ** 2)

        def step(params, x, y):
            value, grads = jax.value_and_grad(loss)(params, x, y)
            return jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads), value

        self._step = jax.jit(step)
        self.loss = None

    def step(self):
        self.params, self.loss = self._step(self.params, self.x, self.y)

    def sync(self):
        self.loss.block_until_ready()
        return float(self.loss)

    def memory_stats(self):
        return self.jax.devices()[0].memory_stats() or {}


class TorchModel:
    """The same MLP in PyTorch: training (THROUGHPUT) or inference only (S3 actors)."""

    def __init__(self, width=1024, depth=3, batch=1024, train=True, seed=0):
        import torch
        self.torch = torch
        torch.manual_seed(seed)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
        self.model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 16)).cuda()
        self.x = torch.randn(batch, width, device="cuda")
        self.y = torch.tanh(self.x @ torch.randn(width, 16, device="cuda") / width ** 0.5)
        self.train = train
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05) if train else None
        self.loss = None
        self.platform = "gpu" if self.x.is_cuda else "cpu"

    def step(self):
        if self.train:
            self.optimizer.zero_grad(set_to_none=True)
            self.loss = self.torch.nn.functional.mse_loss(self.model(self.x), self.y)
            self.loss.backward()
            self.optimizer.step()
        else:
            with self.torch.inference_mode():
                self.loss = self.model(self.x).square().mean()

    def sync(self):
        self.torch.cuda.synchronize()
        return float(self.loss)


class CpuModel:
    """A stand-in 'model' for --simulate runs: pure Python arithmetic, no GPU."""

    platform = "cpu (simulated run)"

    def __init__(self):
        self.loss = 1.0

    def step(self):
        self.loss = sum(i * i for i in range(2000)) * 0 + self.loss * 0.999

    def sync(self):
        return self.loss
