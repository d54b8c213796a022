import sys, pathlib, tempfile, re
sys.path.insert(0, "notebooks")
import run_demo
nb = run_demo.run(pathlib.Path("notebooks/lms_demo.ipynb"), pathlib.Path(tempfile.mkdtemp()), {"N_ROWS": "800", "IMAGE_SIZE": "64"}, timeout_s=300)
for c in nb.cells:
    if c.cell_type == "code" and ("lms_fit --compare {" in c.source or "explain_fit(cnn" in c.source):
        for o in c.get("outputs", []):
            if "text" in o: print("TEXT", o["text"][:3000])
            data = o.get("data", {})
            if "text/plain" in data: print("PLAIN", data["text/plain"][:3000])
            if "text/html" in data:
                h = re.sub(r"<[^>]+>", " ", data["text/html"]); h = re.sub(r"\s+", " ", h)
                print("HTML", h[:3000])
