import os
os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"
import re, keras, numpy as np, tensorflow as tf
from lms_magic import internals

def models():
    def seq():
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="softmax")])
        m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        return m, (np.zeros((5, 8), "float32"), np.zeros(5, "int32"))
    def multi():
        i = keras.Input((8,), name="x")
        a = keras.layers.Dense(3, name="a")(i); b = keras.layers.Dense(1, activation="sigmoid", name="b")(i)
        m = keras.Model(i, {"a": a, "b": b})
        m.compile("sgd", {"a": "mse", "b": "binary_crossentropy"}, metrics={"a": ["mae"], "b": ["accuracy"]})
        return m, (np.zeros((5, 8), "float32"), {"a": np.zeros((5, 3), "float32"), "b": np.zeros((5, 1), "float32")})
    def weighted():
        i = keras.Input((8,)); o = keras.layers.Dense(2)(i)
        m = keras.Model(i, o)
        m.compile("rmsprop", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy", "sparse_top_k_categorical_accuracy"], weighted_metrics=["accuracy"])
        return m, (np.zeros((5, 8), "float32"), np.zeros(5, "int32"), np.ones(5, "float32"))
    def listout():
        i = keras.Input((8,)); o1 = keras.layers.Dense(2)(i); o2 = keras.layers.Dense(1)(i)
        m = keras.Model(i, [o1, o2]); m.compile("adam", ["mse", "mae"], metrics=[["mse"], ["mae"]], loss_weights=[1., .5])
        return m, (np.zeros((5, 8), "float32"), (np.zeros((5, 2), "float32"), np.zeros((5, 1), "float32")))
    def app():
        m = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
        m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
        return m, (np.zeros((5, 32, 32, 3), "float32"), np.zeros(5, "int32"))
    return dict(seq=seq, multi=multi, weighted=weighted, listout=listout, app=app)

def norm(text):
    return re.sub(r"_\d+(?=[/_:()]|$)", "", text)

def state(m):
    return (sorted(norm(v.path) + str(tuple(v.shape)) for v in m.metrics_variables),
            sorted(norm(v.path) + str(tuple(v.shape)) for v in m.optimizer.variables),
            [type(x).__name__ for x in m.metrics], [norm(str(getattr(x, "name", None))) for x in m.metrics],
            repr(getattr(m._compile_loss, "_flat_losses", None))[:0])

def trace_ops(m, data):
    specs = tuple(tf.nest.map_structure(lambda a: tf.TensorSpec((7,) + a.shape[1:], tf.as_dtype(a.dtype)), tuple(data)))
    g = tf.function(m.train_step, autograph=False).get_concrete_function(specs).graph
    return [(op.type, norm(op.name)) for op in g.get_operations()], specs

ok = True
for name, make in models().items():
    keras.utils.set_random_seed(0); m1, data = make()
    keras.utils.set_random_seed(0); m2, _ = make()
    specs = tuple(tf.nest.map_structure(lambda a: tf.TensorSpec((7,) + np.asarray(a).shape[1:], tf.as_dtype(np.asarray(a).dtype)), tuple(data)))
    m1._symbolic_build(data_batch=specs)
    used = internals._built_from_outputs(m2, specs)
    s1, s2 = state(m1), state(m2)
    t1, _ = trace_ops(m1, data); t2, _ = trace_ops(m2, data)
    same = s1 == s2 and t1 == t2
    ok &= same and used
    print(name, "fast path" if used else "FELL BACK", "same state" if s1 == s2 else f"DIFFER {s1} {s2}", "same trace" if t1 == t2 else "TRACE DIFFERS", len(t1))
print("all same" if ok else "SOME DIFFER")
