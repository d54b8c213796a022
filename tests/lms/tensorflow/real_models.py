"""The architectures nobody in this project wrote, as the TensorFlow tests and benchmarks train them: keras.applications'
models at full size or reduced by their own builders (``keras.src.applications``), a Transformer, each with an
optimizer (:class:`Case`), and a callback recording each step's loss and the weights (:class:`StepRecord`).
``test_real_models.py`` says which model shows what."""

import keras
import numpy as np


OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.01, momentum=0.9), "adam": lambda: keras.optimizers.Adam(1e-3)}


def application(name, size):
    def build():
        keras.utils.set_random_seed(5)
        return getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                                 classifier_activation=None)

    build.__name__ = name
    return build


def reduced(name, size=32):
    """keras.applications' own builder of ``name`` at a reduced depth (its blocks and layers unchanged)."""
    from keras.src.applications import densenet, efficientnet, resnet

    def build():
        keras.utils.set_random_seed(5)
        options = dict(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)
        if name == "resnet":
            def stacks(x):
                x = resnet.stack_residual_blocks_v1(x, 64, 1, stride1=1, name="conv2")
                x = resnet.stack_residual_blocks_v1(x, 128, 1, name="conv3")
                return resnet.stack_residual_blocks_v1(x, 256, 1, name="conv4")

            return resnet.ResNet(stacks, False, True, name="resnet", **options)
        if name == "densenet":
            return densenet.DenseNet([2, 2, 2, 2], name="densenet", **options)
        return efficientnet.EfficientNet(1.0, 0.1, 224, blocks_args=efficientnet.DEFAULT_BLOCKS_ARGS[:4],
                                         name="efficientnet", **options)  # its first four stages, a block each

    build.__name__ = name
    return build


def transformer(length=32, vocabulary=1000, width=64, blocks=2):
    def build():
        keras.utils.set_random_seed(6)
        tokens = keras.Input((length,), dtype="int32")
        x = keras.layers.Embedding(vocabulary, width)(tokens)
        for _ in range(blocks):
            attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(x, x)
            x = keras.layers.LayerNormalization()(x + attended)
            fed = keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(x))
            x = keras.layers.LayerNormalization()(x + fed)
        outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x))
        return keras.Model(tokens, outputs, name="transformer")

    build.__name__ = "transformer"
    return build


class Case:
    """One architecture, optimizer, input size, batch and number of steps."""

    def __init__(self, build, optimizer, batch=4, steps=2):
        self.build, self.optimizer, self.batch, self.steps = build, optimizer, batch, steps
        self.name = build.__name__
        self.id = f"{self.name}-{optimizer}"

    def model(self):
        model = self.build()
        model.compile(OPTIMIZERS[self.optimizer](), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def data(self, model, steps):
        rng = np.random.default_rng(0)
        n = self.batch * steps
        shape = tuple(model.inputs[0].shape[1:])
        if model.inputs[0].dtype.startswith("int"):
            x = rng.integers(0, 1000, (n,) + shape).astype("int32")
        else:
            x = rng.random((n,) + shape, dtype="float32")
        return x, rng.integers(0, 10, n)

    def fit(self, callback=None, steps=None):
        """A fresh model trained ``steps`` steps; returns (model, per-step losses, weights after the first step and
        after the last, each as one vector)."""
        model = self.model()
        record = StepRecord()
        model.fit(*self.data(model, steps or self.steps), batch_size=self.batch, epochs=1, verbose=0, shuffle=False,
                  callbacks=[record] + ([callback] if callback else []))
        return model, record.losses, (record.first_weights, weights_of(model))


def weights_of(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


class StepRecord(keras.callbacks.Callback):
    """Each step's loss, and the weights after the first step."""

    def __init__(self):
        super().__init__()
        self.losses, self.first_weights = [], None

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        if self.first_weights is None:
            self.first_weights = weights_of(self.model)


QUICK = [Case(reduced("resnet"), "sgd"), Case(reduced("densenet"), "sgd"), Case(reduced("efficientnet"), "adam"),
         Case(transformer(), "adam")]
FULL = [Case(application(name, 64), optimizer, batch=8, steps=3)
        for name in ("MobileNetV2", "ResNet50", "DenseNet121", "EfficientNetB0", "MobileNetV3Small")
        for optimizer in sorted(OPTIMIZERS)] + [Case(transformer(), optimizer, 8, 3) for optimizer in sorted(OPTIMIZERS)]
