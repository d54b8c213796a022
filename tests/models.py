"""Small models of every kind the tests train (built fresh, seeded), and their data."""

import keras
import numpy as np


def reference_cnn(batch_input=(64, 64, 3)):
    """12 Conv2D 3x3 layers of 32 filters with ReLU, global pooling, Dense (issue 3's reference)."""
    keras.utils.set_random_seed(1)
    layers = [keras.Input(batch_input)]
    layers += [keras.layers.Conv2D(32, 3, padding="same", activation="relu") for _ in range(12)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    return compiled(model)


def reference_cnn_small():
    """The reference CNN's shape on 32x32 inputs: quick to train."""
    return reference_cnn((32, 32, 3))


def mlp():
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((512,))] + [keras.layers.Dense(512, activation="relu") for _ in range(6)]
                             + [keras.layers.Dense(10)])
    return compiled(model)


def residual_bn_dropout():
    """Functional, with residual branches, BatchNormalization and Dropout."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    for _ in range(3):
        branch = keras.layers.Conv2D(16, 3, padding="same")(x)
        branch = keras.layers.BatchNormalization()(branch)
        branch = keras.layers.Activation("relu")(branch)
        branch = keras.layers.Dropout(0.2)(branch)
        x = keras.layers.Add()([x, branch])
    x = keras.layers.GlobalAveragePooling2D()(x)
    return compiled(keras.Model(inputs, keras.layers.Dense(10)(x)))


class SmallCnn(keras.Model):
    """Subclassed: three Conv2D 3x3 layers with ReLU, global pooling, Dense."""

    def __init__(self, filters=16):
        super().__init__()
        self.convs = [keras.layers.Conv2D(filters, 3, padding="same", activation="relu") for _ in range(3)]
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(10)

    def call(self, x, training=False):
        for conv in self.convs:
            x = conv(x)
        return self.head(self.pool(x))


class CustomStep(SmallCnn):
    """Subclassed, with its own train_step."""

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def custom_step():
    keras.utils.set_random_seed(4)
    model = CustomStep()
    model(np.zeros((1, 32, 32, 3), "float32"))
    return compiled(model, metrics=None)  # its train_step reports the loss only


def compiled(model, metrics=("accuracy",)):
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=list(metrics) if metrics else None)
    return model


def images(n=64, size=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, size, size, 3), dtype="float32"), rng.integers(0, 10, n)


def vectors(n=2048, width=512, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, width), dtype="float32"), rng.integers(0, 10, n)


# Kinds of model the docs do not use (issue 54's): each with its data at ``n`` samples.

def encoder_decoder(size=64):
    """A small U-Net: convolutions down, upsampling back with skip concatenations, a label per pixel."""
    keras.utils.set_random_seed(6)
    inputs = keras.Input((size, size, 3))
    skips, x = [], inputs
    for filters in (16, 32, 64):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    for filters, skip in zip((64, 32, 16), reversed(skips)):
        x = keras.layers.UpSampling2D()(x)
        x = keras.layers.Concatenate()([x, skip])
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    return compiled(keras.Model(inputs, keras.layers.Conv2D(4, 1)(x)), metrics=None)


def pixel_labels(n=64, size=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, size, size, 3), dtype="float32"), rng.integers(0, 4, (n, size, size))


def convnext_style(size=64):
    """ConvNeXt's blocks: a 4x4 stride-4 stem, 7x7 depthwise convolutions, LayerNormalization, an inverted MLP
    with GELU, residual adds; downsampling between stages."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((size, size, 3))
    x = keras.layers.LayerNormalization()(keras.layers.Conv2D(32, 4, strides=4)(inputs))
    for stage, filters in enumerate((32, 64)):
        if stage:
            x = keras.layers.Conv2D(filters, 2, strides=2)(keras.layers.LayerNormalization()(x))
        for _ in range(2):
            branch = keras.layers.DepthwiseConv2D(7, padding="same")(x)
            branch = keras.layers.LayerNormalization()(branch)
            branch = keras.layers.Dense(4 * filters, activation="gelu")(branch)
            x = keras.layers.Add()([x, keras.layers.Dense(filters)(branch)])
    x = keras.layers.LayerNormalization()(keras.layers.GlobalAveragePooling2D()(x))
    return compiled(keras.Model(inputs, keras.layers.Dense(10)(x)))


def mobilenet_v3_style(size=64):
    """keras.applications' MobileNetV3Small (hard-swish, squeeze-and-excite), untrained, 10 classes."""
    keras.utils.set_random_seed(8)
    model = keras.applications.MobileNetV3Small(weights=None, input_shape=(size, size, 3), classes=10,
                                                classifier_activation=None, include_preprocessing=False)
    return compiled(model)


def transformer(sequence=64, vocabulary=1000, width=64, heads=4, blocks=2):
    """A small Transformer encoder over token ids: embeddings, self-attention and MLP blocks, a class per text."""
    keras.utils.set_random_seed(9)
    inputs = keras.Input((sequence,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, width)(inputs)
    for _ in range(blocks):
        attended = keras.layers.MultiHeadAttention(heads, width // heads)(x, x)
        x = keras.layers.LayerNormalization()(keras.layers.Add()([x, attended]))
        hidden = keras.layers.Dense(4 * width, activation="gelu")(x)
        x = keras.layers.LayerNormalization()(keras.layers.Add()([x, keras.layers.Dense(width)(hidden)]))
    x = keras.layers.GlobalAveragePooling1D()(x)
    return compiled(keras.Model(inputs, keras.layers.Dense(10)(x)))


def token_ids(n=64, sequence=64, vocabulary=1000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocabulary, (n, sequence)).astype("int32"), rng.integers(0, 10, n)


# Small models for the PyTorch and JAX backends' tests (16x16 images, 8 filters): quick on any backend.
def small_cnn(seed=1, layers=4, size=16):
    """``layers`` Conv2D of 8 filters on ``size`` x ``size`` images, Adam."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((size, size, 3))]
                             + [keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(layers)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def small_residual_bn_dropout(seed=3):
    """:func:`residual_bn_dropout` at 16x16 with 8 filters, SGD at 0.05."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    for _ in range(3):
        branch = keras.layers.Conv2D(8, 3, padding="same")(x)
        branch = keras.layers.BatchNormalization()(branch)
        branch = keras.layers.Dropout(0.2)(keras.layers.Activation("relu")(branch))
        x = keras.layers.Add()([x, branch])
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def small_images(n=64, size=16):
    """Normal random images and labels for the small models."""
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, size, size, 3)).astype("float32"), rng.integers(0, 10, n)


def train(build, data, callback=None, epochs=2):
    """A fresh model of ``build`` trained on ``data``; returns (model, history dict)."""
    model = build()
    keras.utils.set_random_seed(7)
    history = model.fit(*data, batch_size=16, epochs=epochs, verbose=0, callbacks=[callback] if callback else [])
    return model, history.history

def small_transformer(seed=4):
    """One Transformer encoder block: self-attention and a GELU feed-forward, each with a residual sum and
    LayerNormalization."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Dense(32)(keras.layers.Reshape((16, 48))(inputs))
    x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(2, 16)(x, x))
    feed = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(x))
    x = keras.layers.LayerNormalization()(x + feed)
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x)))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
