"""The GEM teacher as an MLflow pyfunc model, logged "from code": MLflow stores this file
with the model and runs it on ``mlflow.pyfunc.load_model`` (nothing is unpickled). The
weights come from the model's ``model`` artifact through gem.model.store: every file
checked against digests.json, the tensors read weights-only. See gem/training/pyfunc.py
for the input and output."""

import mlflow
from mlflow.pyfunc import PythonModel


class GemTeacher(PythonModel):
    def load_context(self, context):
        from gem.model.store import load_model

        self.stored = load_model(context.artifacts["model"])

    def predict(self, context, model_input, params=None):
        from gem.training.pyfunc import score_frame

        return score_frame(self.stored.model, self.stored.spec, model_input, params)


mlflow.models.set_model(GemTeacher())
