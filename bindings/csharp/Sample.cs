// Streams a story: mono Sample.exe [model.gguf] [prompt]
using System;
using System.IO;
using LibLlm;

public static class Sample
{
    public static int Main(string[] args)
    {
        string path = args.Length > 0 ? args[0]
            : Path.Combine(Environment.GetEnvironmentVariable("LLM_MODELS_DIR") ?? ".", "stories260K.gguf");
        string prompt = args.Length > 1 ? args[1] : "Once upon a time";
        try
        {
            using (var model = Model.Load(path))
            using (var session = model.CreateSession())
            {
                var sampling = Sampling.Default;
                sampling.Temperature = 0.8f;
                sampling.TopP = 0.95f;
                sampling.Seed = 42;
                Console.Write(prompt);
                foreach (string text in session.Generate(prompt, 200, sampling))
                    Console.Write(text);
                Console.WriteLine();
            }
            return 0;
        }
        catch (LlmException e)
        {
            Console.Error.WriteLine("error: " + e.Message + " [" + e.Status + "]");
            return 1;
        }
    }
}
